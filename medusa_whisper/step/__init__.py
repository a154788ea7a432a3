"""The decoder step: one pass of whisper's decoder over rows at positions and cache slots.

Its calls are ``fixed.FixedStep``'s (the fixed-shape step: dense weights in the products' dtype,
every slot attended with a mask, what a CUDA graph replays); ``cpu.CpuStep`` and ``cpu.CpuBatchStep``
answer the same calls with the CPU's products: the decoder run with explicit slots (``decoder``),
its preallocated cache (``cache``), row-invariant attention and masks (``attention``), the compute
types' layers (``compute``: int8 and bfloat16, the kernels ``routes`` measures per machine, the
vocabulary ``projection``, the ``int8_kernels``), and rows multiplied together or alone
(``together``). Nothing here knows decoding's options, proposers or files."""
