"""What an operator uses to see, explain and fix delivery: status, trace, tail, replay,
declarative subscriptions, metrics, logs and the dashboard."""
