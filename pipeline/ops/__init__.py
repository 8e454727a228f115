"""Operations surface of a worker: the HTTP server (/metrics, /healthz, /readyz,
/api/stats, the built-in dashboard) and the statistics it derives from the metrics.
docs/OPERATIONS.md describes all of it."""
