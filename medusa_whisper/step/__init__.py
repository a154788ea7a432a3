"""The decoder step: one pass of whisper's decoder over rows at positions and cache slots.

One step on every device, ``fixed.FixedStep``: its buffers, calls and arithmetic, over a products
object that says how it multiplies and attends: ``fixed.DenseProducts`` (dense weights in the
products' dtype, every slot attended with a mask, what a CUDA graph replays) or ``cpu.CpuProducts``
(the CPU's: the compute type's modules, row-invariant attention and masks (``attention``) over
the written slots). Still beside it, for the candidates' rows and the draft heads' blocks: the
decoder run with explicit slots (``decoder``) and its cache (``cache``). Under them the compute
types' layers (``compute``: int8 and bfloat16, the kernels ``routes`` measures per machine, the
vocabulary ``projection``, the ``int8_kernels``), and rows multiplied together or alone
(``together``). Nothing here knows decoding's options, proposers or files."""
