"""kvnumba.compat: ``sgl_kernel.kvcacheio`` resolving to kvnumba."""
