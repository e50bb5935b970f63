//! Ingest with broker acceptance: send, status, register; a project's
//! parked events (list, redrive, discard).

use super::*;

#[derive(Debug, Subcommand)]
pub(crate) enum IngestCommand {
    /// Accept one event for a stream (`202` once durable; it reaches the
    /// stream shortly after).
    Send(IngestSendArgs),
    /// Pending events and capacity of the HTTP buffer; the JetStream
    /// bridge's stream, fence, pending messages, last error and diagnostics.
    Status(AdminArgs),
    /// Register the JetStream stream the bridge sees now (it must be empty):
    /// after a recreation, the bridge consumes nothing until this.
    Register(AdminArgs),
    /// A project's parked events: accepted, then refused for good (a
    /// reactor's final refusal, a key used with other content, a JetStream
    /// message that is not an event), kept until redriven or discarded.
    Parked(IngestParkedArgs),
    /// Append a parked event again (its idempotency key: once at most);
    /// once in its stream it is settled. Prints the append's answer.
    Redrive(ParkedIdArgs),
    /// Drop a parked event for good, recorded as an error-occurred line on
    /// its stream.
    Discard(ParkedIdArgs),
}

#[derive(Debug, Args)]
pub(crate) struct IngestParkedArgs {
    #[command(flatten)]
    pub project: Project,
    /// Only this stream's, such as /orders/eu.
    #[arg(long)]
    pub path: Option<String>,
    /// After this parked event id (the previous page's nextAfterId).
    #[arg(long, default_value_t = 0)]
    pub after_id: i64,
    /// At most this many (1 to 1000).
    #[arg(long, default_value_t = 100)]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub(crate) struct ParkedIdArgs {
    #[command(flatten)]
    pub project: Project,
    /// The parked event's id (from `streamhost ingest parked`).
    pub id: i64,
}

#[derive(Debug, Args)]
pub(crate) struct IngestSendArgs {
    #[command(flatten)]
    pub project: Project,
    /// Stream path, such as /orders/eu.
    pub stream: String,
    /// Event type.
    #[arg(long = "type")]
    pub event_type: String,
    /// Idempotency key (required: a retry with the same key is accepted once).
    #[arg(long)]
    pub key: String,
    /// Payload, a JSON object.
    #[arg(long, default_value = "{}")]
    pub payload: String,
}

pub(super) async fn ingest(command: IngestCommand) -> Result<()> {
    match command {
        IngestCommand::Send(a) => {
            let payload = parse_object("--payload", &a.payload)?;
            let stream = StreamAddress::new(Namespace::project(&a.project.project)?, &a.stream)?;
            let event = EventInput::new(a.event_type)
                .payload(payload)
                .idempotency_key(a.key);
            let call = mapping::render_ingest(&IngestRequest::Accept {
                stream,
                events: vec![event],
            });
            print_answer(api(&a.project.url, a.project.token.as_deref(), call).await?).await
        }
        IngestCommand::Status(a) => {
            let call = mapping::render_ingest(&IngestRequest::Status);
            print_answer(api(&a.url, a.token.as_deref(), call).await?).await
        }
        IngestCommand::Register(a) => {
            let call = mapping::render_ingest(&IngestRequest::Register);
            print_answer(api(&a.url, a.token.as_deref(), call).await?).await
        }
        IngestCommand::Parked(a) => {
            let path = a
                .path
                .as_deref()
                .map(crate::stream::canonicalize_path)
                .transpose()?;
            let call = mapping::render_ingest(&IngestRequest::Parked {
                project: a.project.project.clone(),
                query: crate::ingest::ParkedQuery {
                    path,
                    after_id: a.after_id,
                    limit: a.limit,
                },
            });
            print_answer(api(&a.project.url, a.project.token.as_deref(), call).await?).await
        }
        IngestCommand::Redrive(a) => {
            let call = mapping::render_ingest(&IngestRequest::Redrive {
                project: a.project.project.clone(),
                id: a.id,
            });
            print_answer(api(&a.project.url, a.project.token.as_deref(), call).await?).await
        }
        IngestCommand::Discard(a) => {
            let call = mapping::render_ingest(&IngestRequest::Discard {
                project: a.project.project.clone(),
                id: a.id,
            });
            print_answer(api(&a.project.url, a.project.token.as_deref(), call).await?).await
        }
    }
}
