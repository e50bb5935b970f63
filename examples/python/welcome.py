"""The welcome reactor: for each `user-signed-up` event appended to a stream
that configures it, a webhook to the sign-up's `welcomeUrl`, committed with
the event (or the append fails with the reactor's message)."""

from streamhost_guest import Failure, define_reactor

SIGNED_UP = "user-signed-up"


def react(event, effects):
    if event.type != SIGNED_UP:
        return
    p = event.payload if isinstance(event.payload, dict) else {}
    user, email = p.get("userId"), p.get("email", "")
    if not isinstance(user, str) or not user:
        raise Failure.fatal(f"the {SIGNED_UP} event at offset {event.offset} has no userId")
    if email == "later@example.com":
        raise Failure.retry(f"cannot welcome {user} now: the mail system is down")
    effects.webhook(
        f"welcome:{user}", p.get("welcomeUrl"), {"userId": user, "email": email, "template": "welcome"}
    ).typed("SendWelcome").with_metadata({"correlationId": f"sign-up-{event.offset}"})


Reactor = define_reactor(react=react)
