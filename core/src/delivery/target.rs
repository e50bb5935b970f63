//! A subscription's receiver, parsed once per run into what its deliveries
//! need: the typed target (copy, webhook, ITX, wake) and the compiled
//! filter. A receiver that cannot be parsed is a configuration error that
//! halts the run with a message naming the bad value; it is never retried.

use crate::filter::CompiledFilter;
use crate::jsonata::Expression;
use crate::stream::StreamAddress;
use crate::subscription::{OnFailingEvent, OutboundSubscription, Receiver};

/// Where a subscription's deliveries go.
#[derive(Debug, Clone)]
pub enum Target {
    /// Append to another stream of the same namespace.
    Copy {
        receiver: StreamAddress,
        /// Applied by the receiving stream (after its fence and cycle checks).
        transform: Option<String>,
    },
    /// POST one event at a time.
    Webhook {
        url: String,
        transform: Option<Expression>,
        /// The offset of the `subscription-configured` event (sent along).
        configured_at: u64,
    },
    /// Call an exported function of a component with a batch.
    Itx {
        project: String,
        component: String,
        function: String,
        transform: Option<Expression>,
    },
    /// Fold the batch into a processor's state.
    Wake { project: String, component: String },
}

impl Target {
    /// The receiver's kind, as metrics label it.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Copy { .. } => "copy",
            Target::Webhook { .. } => "webhook",
            Target::Itx { .. } => "itx",
            Target::Wake { .. } => "wake",
        }
    }

    /// Short text for logs and failure messages.
    pub fn label(&self) -> String {
        match self {
            Target::Copy { receiver, .. } => format!("copy to {:?}", receiver.path),
            Target::Webhook { url, .. } => format!("webhook POST to {url}"),
            Target::Itx {
                component,
                function,
                ..
            } => format!("itx call {component}.{function}"),
            Target::Wake { component, .. } => format!("processor {component:?} wake"),
        }
    }

    /// The component the target calls (an ITX call or a processor wake).
    pub fn component(&self) -> Option<&str> {
        match self {
            Target::Itx { component, .. } | Target::Wake { component, .. } => Some(component),
            Target::Copy { .. } | Target::Webhook { .. } => None,
        }
    }

    /// Most events one delivery carries: webhooks POST one event at a time.
    pub fn events_max(&self) -> usize {
        match self {
            Target::Webhook { .. } => 1,
            _ => super::BATCH_EVENTS_MAX,
        }
    }

    /// Whether the receiver enforces the delivery timeout itself, with a
    /// message of its own (the pipeline's deadline then comes a little later).
    pub fn times_itself(&self) -> bool {
        !matches!(self, Target::Copy { .. })
    }
}

/// Everything a run's deliveries need from its configuration, parsed once.
#[derive(Debug, Clone)]
pub struct Route {
    pub target: Target,
    pub filter: CompiledFilter,
    pub on_failing_event: OnFailingEvent,
}

impl Route {
    /// Parses the receiver of `sub`, a subscription on the stream at `source`.
    pub fn parse(
        sub: &OutboundSubscription,
        source: &StreamAddress,
        limits: crate::jsonata::Limits,
    ) -> Result<Route, String> {
        let project = || {
            source
                .namespace
                .project_id()
                .map(str::to_string)
                .ok_or_else(|| {
                    format!(
                        "{} receivers need a project stream, not one of the global namespace",
                        sub.configuration.receiver.action()
                    )
                })
        };
        let transform = |t: &Option<String>| {
            t.as_deref()
                .map(|t| crate::jsonata::compile(t, limits))
                .transpose()
        };
        let copy = matches!(sub.configuration.receiver, Receiver::CopyToStream { .. });
        let target = match &sub.configuration.receiver {
            Receiver::CopyToStream {
                receiving_stream_path,
                jsonata_transform,
                ..
            } => Target::Copy {
                receiver: StreamAddress::new(source.namespace.clone(), receiving_stream_path)
                    .map_err(|e| {
                        format!(
                            "receivingStreamPath {receiving_stream_path:?}: {}",
                            e.message
                        )
                    })?,
                transform: jsonata_transform.clone(),
            },
            Receiver::WebhookPost {
                url,
                jsonata_transform,
                ..
            } => Target::Webhook {
                url: url.clone(),
                transform: transform(jsonata_transform)?,
                configured_at: sub.configured_at_offset,
            },
            Receiver::ItxCall {
                expression,
                jsonata_transform,
                ..
            } => {
                let crate::itx::Target::ComponentFunction {
                    component,
                    function,
                } = crate::itx::resolve(expression)?;
                Target::Itx {
                    project: project()?,
                    component,
                    function,
                    transform: transform(jsonata_transform)?,
                }
            }
            Receiver::ProcessorWake { expression } => Target::Wake {
                project: project()?,
                component: crate::itx::wake_component(expression)?,
            },
            Receiver::Reactor { .. } => {
                return Err("a reactor runs inside appends: it has no delivery".into())
            }
        };
        Ok(Route {
            target,
            filter: CompiledFilter::new(sub.configuration.filter.as_ref(), copy, limits)?,
            on_failing_event: sub
                .configuration
                .receiver
                .delivery()
                .map_or(OnFailingEvent::Halt, |d| d.on_failing_event),
        })
    }
}
