//! Commands on subscriptions: subscribe (every receiver kind).

use super::*;

/// The receiver of a new subscription: exactly one.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub(crate) struct ReceiverArgs {
    /// Copy the events to this stream (a path in the same namespace).
    #[arg(long, value_name = "PATH")]
    pub copy_to: Option<String>,
    /// POST each event to this URL (http or https; project streams only).
    #[arg(long, value_name = "URL")]
    pub webhook: Option<String>,
    /// Call this ITX expression with each batch, as JSON
    /// (`'["components", ["get", "billing"], "process-event-batch"]'`).
    #[arg(long, value_name = "EXPRESSION")]
    pub itx: Option<String>,
    /// Wake this processor component with the events.
    #[arg(long, value_name = "COMPONENT")]
    pub wake: Option<String>,
    /// Run this component's reactor inside each matching append (its
    /// refusal refuses the append).
    #[arg(long, value_name = "COMPONENT")]
    pub reactor: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SubscribeArgs {
    #[command(flatten)]
    pub target: Target,
    /// The subscription key (unique on the source stream).
    pub key: String,
    #[command(flatten)]
    pub receiver: ReceiverArgs,
    /// Only events of this type (repeatable).
    #[arg(long = "type")]
    pub event_types: Vec<String>,
    /// Only events for which this JSONata condition is true.
    #[arg(long = "where")]
    pub condition: Option<String>,
    /// A JSONata transform applied to each event (copy, webhook, itx).
    #[arg(long)]
    pub transform: Option<String>,
    /// Where delivery starts: `beginning` (the whole log) or `now`.
    #[arg(long, default_value = "now", value_parser = ["beginning", "now"])]
    pub start: String,
    /// What a failing event does: `halt` the subscription, or `skip` it
    /// with an error-occurred line (a final failure at once, one that may
    /// heal once its retries are spent).
    #[arg(long, default_value = "halt", value_parser = ["halt", "skip"])]
    pub on_failing_event: String,
    /// A description kept with the subscription.
    #[arg(long)]
    pub description: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct SubscriptionArgs {
    #[command(flatten)]
    pub target: Target,
    /// The subscription key.
    pub key: String,
}

#[derive(Debug, Args)]
pub(crate) struct ResumeSubscriptionArgs {
    #[command(flatten)]
    pub target: Target,
    /// The subscription key.
    pub key: String,
    /// Resume from the events after this offset instead of where it halted.
    #[arg(long)]
    pub after_offset: Option<u64>,
}

#[derive(Debug, Args)]
pub(crate) struct SetCursorArgs {
    #[command(flatten)]
    pub target: Target,
    /// The subscription key.
    pub key: String,
    /// Deliver the events after this offset.
    #[arg(long)]
    pub after_offset: u64,
}

/// `streamhost subscribe`: a subscription-configured event on the source.
pub(super) async fn subscribe(a: SubscribeArgs) -> Result<()> {
    use crate::subscription::Subscription;
    let r = &a.receiver;
    let mut subscription = if let Some(path) = &r.copy_to {
        Subscription::copy_to(&a.key, path)
    } else if let Some(url) = &r.webhook {
        Subscription::webhook(&a.key, url)
    } else if let Some(expression) = &r.itx {
        let expression: Value = serde_json::from_str(expression)
            .with_context(|| format!("--itx {expression:?} is not JSON"))?;
        Subscription::itx(&a.key, expression)
    } else if let Some(component) = &r.wake {
        // The server refuses a deployed component that is not a processor.
        Subscription::wake(&a.key, component)
    } else if let Some(component) = &r.reactor {
        Subscription::reactor(&a.key, component)
    } else {
        bail!("name the receiver: --copy-to, --webhook, --itx, --wake or --reactor");
    };
    if a.start == "beginning" {
        subscription = subscription.from_beginning();
    }
    if a.on_failing_event == "skip" {
        subscription = subscription.skip_failing_events();
    }
    if let Some(t) = &a.transform {
        if r.wake.is_some() || r.reactor.is_some() {
            bail!("--transform does not apply to a processor wake or a reactor");
        }
        subscription = subscription.transform(t);
    }
    if !a.event_types.is_empty() {
        subscription = subscription.event_types(a.event_types.clone());
    }
    if let Some(c) = &a.condition {
        subscription = subscription.condition(c);
    }
    if let Some(d) = &a.description {
        subscription = subscription.description(d);
    }
    let configured = AppendInput::new([subscription.to_event()]);
    request(&a.target, StreamRequest::Append(configured)).await
}
