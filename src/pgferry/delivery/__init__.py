"""Webhook delivery: subscriptions, HTTP, signing, retries and dead letters."""
