"""GPU check, run by hand on a CUDA machine (CI has none): spindle.torch with pin_memory under the fork and spawn
contexts against torch, a zero-copy numpy batch pinned and copied to the GPU, and DLPack into JAX on the GPU.
Prints a JSON report; every value should be true. Last run: an H200 (torch 2.11+cu130, JAX 0.11): all true."""
import json, time, numpy as np, torch
import spindle, spindle.torch as st

class D(torch.utils.data.Dataset):
    def __len__(self): return 256
    def __getitem__(self, i): return {"x": torch.full((3, 64, 64), float(i)), "y": i}

class N:
    def __len__(self): return 512
    def __getitem__(self, i): return np.full((64, 64, 3), i % 251, np.uint8)

def main():
    out = {"cuda": torch.cuda.is_available(), "device": torch.cuda.get_device_name(0)}
    torch.cuda.init(); torch.zeros(1, device="cuda")          # CUDA live in the consumer before loaders
    for context in ("fork", "spawn"):
        kw = dict(batch_size=32, shuffle=True, num_workers=2, pin_memory=True)
        ours = list(st.DataLoader(D(), generator=torch.Generator().manual_seed(0), multiprocessing_context=context, **kw))
        ref = list(torch.utils.data.DataLoader(D(), generator=torch.Generator().manual_seed(0), **kw))
        same = all(torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"]) for a, b in zip(ours, ref))
        pinned = all(a["x"].is_pinned() and a["y"].is_pinned() for a in ours)
        gpu = [a["x"].to("cuda", non_blocking=True) for a in ours]
        torch.cuda.synchronize()
        on_gpu = all(torch.equal(g.cpu(), a["x"]) for g, a in zip(gpu, ours))
        out[context] = dict(batches=len(ours), same_as_torch=same, pinned=pinned, cuda_copy_ok=on_gpu)
    # Zero-copy numpy batches from spindle.DataLoader, into CUDA torch via pinning and into JAX on GPU via DLPack.
    batch = next(iter(spindle.DataLoader(N(), batch_size=64, num_workers=2)))
    t = torch.from_numpy(batch).pin_memory().to("cuda", non_blocking=True)
    torch.cuda.synchronize()
    out["numpy_to_cuda_ok"] = bool((t[:, 0, 0, 0].cpu().numpy() == np.arange(64) % 251).all())
    try:
        import jax, jax.dlpack
        j = jax.dlpack.from_dlpack(t)
        out["jax_devices"] = str(j.devices())
        out["dlpack_to_jax_ok"] = bool((np.asarray(j[:, 0, 0, 0]) == np.arange(64) % 251).all())
    except Exception as e:
        out["dlpack_to_jax_error"] = repr(e)
    print(json.dumps(out, indent=1))

if __name__ == '__main__':
    main()
