"""GPU time from program `cudakernels` (gfxbpf's CUPTI injection library, gpu/cupti):
its kernel rows, names and launch-sampling estimates (`kernels.py`), read by
`profile --gpu` through the profiling engine and by `watch cuda --gpu`."""
