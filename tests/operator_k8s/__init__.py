"""The real operator against kmock, an in-memory Kubernetes API. The rules of a real cluster kmock
lacks (admission plugins, controllers, the kubelet, garbage collection, CRD limits) are acted out by
these tests; docs/real-cluster-rules.md lists each with its source and the test that holds it."""
