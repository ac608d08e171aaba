"""The decision core: a snapshot of the cluster goes in, decisions come out.

Nothing in this package imports Django. The Celery tick, the trace simulator, the
dry run and the benchmarks all call the same functions, so a behaviour seen in one
of them is the behaviour of all of them.
"""
