"""PyTorch's spelling of a pool: ``gpuipc.torch.MemPool(client)`` is a cuda-vmm `Pool` whose
``with`` block routes torch's allocations into it (torch.cuda.MemPool over a
torch.cuda.memory.CUDAPluggableAllocator of libgpuipc's gpuipc_torch_alloc and gpuipc_torch_free):

    import gpuipc.torch
    pool = gpuipc.torch.MemPool(c, device=0)
    with pool:
        model = build()                      # every parameter lies in shareable memory
    c.publish_state_dict(model.state_dict(), 'weights', copy=False)

Importing this module does not import torch; the pool does so when it is entered.
"""
from .pool import Pool


class MemPool(Pool):
    """A cuda-vmm Pool on `device` for torch tensors (Client.pool's options)."""

    def __init__(self, client, device: int = 0, segment_size: int = 0, max_segment_size: int = 0, reserve: int = 0,
                 writable: bool = False, broker_held: bool = False) -> None:
        super().__init__(client, 'cuda-vmm', device, segment_size, max_segment_size, reserve, writable, broker_held)
