"""Getting the measurements of the GPU issue off a borrowed CUDA machine: pack here, run there."""
