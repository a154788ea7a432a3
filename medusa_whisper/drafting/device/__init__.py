"""Proposers as device programs (``base.DeviceProposer``): the Medusa heads (every kind), the EAGLE
head, the CTC head's pointer and the two draft heads together. Inside the verification pass on the
fixed-shape step; driven between passes where the host accepts (``hosted.Hosted``).
``drafting.factory.device_proposer`` builds one from a decoding's options."""
