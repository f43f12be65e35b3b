"""The inference service GPU sharing lends nodes to, in Kubernetes mode.

- launch: the `inference` namespace and Deployment, its kubelet and its gateway, started
- kubelet: runs the inference pods' servers, one process for every node
- gateway: one process in front of every inference pod's server
- server: the inference server stand-in, one per pod
- pods: what the kubelet and the gateway share (the API, an inference pod)
- changes: wake a loop when a watched list changes, as an informer does
"""
