//! The fenced outbox: intents inserted under `palisade.fence` and delivered by a relay
//! with an idempotency key (work in progress).
