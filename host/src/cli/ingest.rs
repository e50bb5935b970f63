//! Ingest with broker acceptance: send, status, register.

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
    }
}
