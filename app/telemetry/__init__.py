"""What an operator watches: Prometheus metrics, JSON logs with request and run ids, and
optional OpenTelemetry traces."""
