//! The welcome reactor: one webhook per new user, committed with the event
//! that signed the user up. Each `user-signed-up` event
//! (`{"userId", "email", "welcomeUrl"}`) yields one webhook effect keyed
//! `welcome:<userId>` (so a second sign-up of the same user sends nothing
//! new) that POSTs `{"userId", "email", "template": "welcome"}` to
//! `welcomeUrl`, typed `SendWelcome` with metadata
//! `{"correlationId": "sign-up-<offset>"}`. A sign-up without a `userId` is refused: the append fails
//! with `422 reactor-failed` and commits nothing. A sign-up whose email is
//! `later@example.com` is refused for now (`retryable`: the mail system is
//! down, say): the append fails with `503 reactor-unavailable`.
//!
//! The same component is also a processor (it exports both interfaces):
//! its state counts the sign-ups it folded.

use serde::{Deserialize, Serialize};
use streamhost_guest::{Context, Effects, Event, Failure, Processor, Reactor};

/// The event type it reacts to.
pub const SIGNED_UP: &str = "user-signed-up";

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignedUp {
    user_id: Option<String>,
    #[serde(default)]
    email: String,
    welcome_url: String,
}

pub struct Welcome;

impl Reactor for Welcome {
    fn react(event: &Event, effects: &mut Effects) -> Result<(), Failure> {
        if event.event_type != SIGNED_UP {
            return Ok(());
        }
        let signed_up: SignedUp = event.payload_as()?;
        let Some(user) = signed_up.user_id.filter(|u| !u.is_empty()) else {
            return Err(Failure::fatal(format!(
                "the {SIGNED_UP} event at offset {} has no userId",
                event.offset
            )));
        };
        if signed_up.email == "later@example.com" {
            return Err(Failure::retryable(format!(
                "cannot welcome {user} now: the mail system is down"
            )));
        }
        effects
            .webhook(
                format!("welcome:{user}"),
                &signed_up.welcome_url,
                &serde_json::json!({"userId": user, "email": signed_up.email, "template": "welcome"}),
            )
            .typed("SendWelcome")
            .metadata(&serde_json::json!({"correlationId": format!("sign-up-{}", event.offset)}));
        Ok(())
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SignUps {
    pub count: u64,
}

impl Processor for Welcome {
    type State = SignUps;
    const SLUG: &'static str = "welcome";
    const VERSION: &'static str = "1.0.0";
    const CONSUMES: &'static [&'static str] = &[SIGNED_UP];

    fn fold(state: &mut SignUps, _event: &Event, _ctx: &mut Context) -> Result<(), Failure> {
        state.count += 1;
        Ok(())
    }
}

streamhost_guest::reactor!(Welcome);
streamhost_guest::processor!(Welcome);
