"""`tidebatch profile` (pipeline/commands/profile.py): a pipeline's model measured on
this machine over batch sizes, intra-op threads and executors (sweep.py), the cost of
its codec and result documents per request (stages.py), t(n) = a + b·n fitted per
configuration and the best one recommended (fit.py), all driven by measure.py."""
