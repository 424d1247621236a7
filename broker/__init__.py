"""gfxbpf.broker: the privilege-separation daemon."""
