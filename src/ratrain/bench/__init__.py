"""Benchmarks a user runs through the CLI (`ratrain bench cluster`): the peer systems
(torch.distributed.pipelining with DDP or FSDP2, DeepSpeed's PipelineEngine) and the
measured comparison on an emulated bandwidth-constrained network (`ratrain emulate`).
Imports torch."""
