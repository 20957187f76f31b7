"""The fixed ports of a job's processes, besides the ones the spec sets (trainer.port, rollout.port)."""
RENDEZVOUS_PORT = 29500  # torchrun master port on trainer pod 0
SYNC_STORE_PORT = 29600  # weight-sync TCPStore hosted by trainer rank 0
