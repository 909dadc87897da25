"""The NodeSet controller: Slurm nodes as pods.

Read `sync.py` for the steps of one reconcile, then one rule per module: `scalein.py` (which
pods go, drain, the fail-closed drained check, deletion — also on NodeSet deletion),
`update.py` (the rolling update), `status.py` (status and conditions), `mirror.py` (state
both ways). `builder.py` holds the pure object builders, `pods.py` pure pod queries,
`podcontrol.py` and `slurmcontrol.py` the side effects on each side, `controller.py` what is
watched.
"""
