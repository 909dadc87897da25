"""The NodeSet controller: Slurm nodes as pods.

Read `sync.py` top to bottom for one reconcile; `scaling.py` holds the scale-in order,
`update.py` the rolling update, `builder.py` the pure object builders, `podcontrol.py` and
`slurmcontrol.py` the side effects on each side.
"""
