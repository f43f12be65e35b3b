"""Slurm on Kubernetes: Slinky's operator and the kubelet, and the CMK platform.

- kubernetes_mode: Kubernetes mode of the sandbox (the emulator, the operator, the Nodes)
- operator: the emulated Slinky NodeSet controller (a client of Kubernetes and Slurm)
- operator_pods: which Nodes a NodeSet runs on, and the slurmd pod it runs there
- operator_slurm: what the operator may do to a Slurm node, and how it reads one
- operator_workloads: Controller, Accounting and LoginSet as pods; orphans collected
- kubelet: runs the operator's pods as the real daemons and reports them Ready
- autoscaler: the cluster autoscaler: a NodeSet scaled beyond its Nodes gets machines
- node_groups: where those machines come from (a CMK node pool, the Managed Slurm node set)
- agent_daemonset: the node agent as the DaemonSet it ships as
- agent_pods: the kubelet's part for the agent's DaemonSet pods
- cmk_platform: `sandbox up --platform cmk`: Slurm as Slinky on a CMK cluster
"""
