// The welcome reactor: for each `user-signed-up` event appended to a stream
// that configures it, a webhook to the sign-up's `welcomeUrl`, committed
// with the event (or the append fails with the reactor's message).
import { defineReactor, Failure } from "@streamhost/guest";

export const SIGNED_UP = "user-signed-up";

export const reactor = defineReactor({
  react(event, effects) {
    if (event.type !== SIGNED_UP) return;
    const { userId, email = "", welcomeUrl } = event.payload ?? {};
    if (typeof userId !== "string" || userId === "") {
      throw Failure.fatal(`the ${SIGNED_UP} event at offset ${event.offset} has no userId`);
    }
    if (email === "later@example.com") {
      throw Failure.retryable(`cannot welcome ${userId} now: the mail system is down`);
    }
    effects
      .webhook(`welcome:${userId}`, welcomeUrl, { userId, email, template: "welcome" })
      .typed("SendWelcome")
      .withMetadata({ correlationId: `sign-up-${event.offset}` });
  },
});
