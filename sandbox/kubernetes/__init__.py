"""The Kubernetes API server the sandbox stands in for (no kube-apiserver runs here).

- emulator: the API server process (routes, auth, the HTTP front)
- store: the objects, kept by the rules the API server enforces
- objects: kinds, errors, selectors, checks
- controllers, deployments, daemonsets, scheduler: what the other components of a cluster do
- patch: the three PATCH flavours
- scale: the `/scale` subresource
- crd_schema: Slinky's custom resources against their CRD schemas (`slinky_crds/`)
- watch, watch_stream: watch events, and a watch over HTTP
- table: server-side printing for `kubectl get`
- discovery, openapi, openapi_v2: what kubectl reads before any verb
- protobuf: the protobuf request bodies kubectl sends
- access: `kubectl auth can-i`
- tls: TLS, so kubectl sends its bearer token
"""
