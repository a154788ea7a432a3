"""Proposers that draft inside the verification pass, as device programs (``base.DeviceProposer``):
Medusa-Linear heads, the EAGLE head, the CTC head and the two draft heads together.
``drafting.factory.device_proposer`` builds one from a decoding's options."""
