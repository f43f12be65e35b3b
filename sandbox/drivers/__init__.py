"""What drives the sandbox: the demo and its scenarios, chaos, outages and their matrices.

- demo: the demo (a job, a fault on one of its nodes, the remediation)
- silent_demo: `demo --scenario hang|slow`
- sharing_demo: `demo --scenario share` (GPU nodes lent to inference and back)
- sharing_borrow_demo: `demo --scenario borrow` (an inference node lent for a repair)
- leaf_demo: `demo --scenario leaf` (a bad leaf: one systemic incident, no machine repaired)
- load: inference load at the gateway (open-loop Poisson arrivals)
- chaos: `autoclusters chaos`: a named fault, optionally a process killed mid-step
- outage: `sandbox outage`: a dependency away for a while, and one outage case
- outage_matrix: the (component, step) outage cases
- controller_crash: slurmctld crashed and started again mid-incident
- history_ticks: wake a watcher at each new event of a workflow's history
- ticket_cli: `autoclusters sandbox ticket`: the provider's answers to hand-offs
"""
