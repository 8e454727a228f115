"""The discrete-event simulator (`tidebatch simulate`): the worker's own batching core
on a fake clock, against arrival scenarios and latency curves. One job per module:
curves.py (t(n) = a + b·n), rows.py (rows per request), arrivals.py, workload.py
(scenarios), trace.py (recorded arrivals), specs.py (the registered policies by label),
engine.py (one run; the model it simulates), results.py (what a run measures),
tuning.py (static-tuned), compare.py, table.py, tenants.py (the tenant scenario),
percentile.py. Importers name the module that holds what they use."""
