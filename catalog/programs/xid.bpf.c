// SPDX-License-Identifier: GPL-2.0
/*
 * xid: NVIDIA Xid errors from the driver's nvidia:nvidia_dev_xid tracepoint
 * (fields dev, error_code, msg; dev and msg are __data_loc strings). One
 * ring-buffer record per error, and a count per (device, code).
 *
 * The NVIDIA driver's trace header is not in the kernel tree; the default
 * offsets below are the layout its field list implies (dev dl@8,
 * error_code u32@12, msg dl@16). The broker overwrites them from the live
 * format file.
 */
#include "gfxbpf.h"

#define DEV_LEN 32
#define MSG_LEN 192

const volatile __u32 off_dev = 8;
const volatile __u32 off_code = 12;
const volatile __u32 off_msg = 16;

struct xid_event {
	__u64 ts_ns;  /* CLOCK_MONOTONIC (bpf_ktime_get_ns) */
	__u32 code;
	__u32 pid;    /* the thread that reported it (often a driver thread) */
	char dev[DEV_LEN];
	char msg[MSG_LEN];
};

struct xid_key {
	char dev[DEV_LEN];
	__u32 code;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} xid_events SEC(".maps");

/* (device, Xid code) -> errors */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct xid_key);
	__type(value, __u64);
} xid_counts SEC(".maps");

/* Ring-buffer records that did not fit (the reader fell behind). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} xid_dropped SEC(".maps");

/*
 * A real subprogram (not inlined) so struct xid_event is in the object's
 * BTF, where clients find the record layout.
 */
static __attribute__((noinline)) int fill_event(struct xid_event *ev, void *ctx,
						 const struct xid_key *key)
{
	ev->ts_ns = bpf_ktime_get_ns();
	ev->code = key->code;
	ev->pid = (__u32)bpf_get_current_pid_tgid();
	__builtin_memcpy(ev->dev, key->dev, sizeof(ev->dev));
	__builtin_memset(ev->msg, 0, sizeof(ev->msg));
	gfx_ctx_str(ctx, off_msg, ev->msg, sizeof(ev->msg));
	return 0;
}

SEC("tracepoint/nvidia/nvidia_dev_xid")
int dev_xid(void *ctx)
{
	struct xid_event *ev;
	struct xid_key key;
	__u32 zero = 0;
	__u64 *dropped;

	__builtin_memset(&key, 0, sizeof(key));
	key.code = gfx_ctx_u32(ctx, off_code);
	gfx_ctx_str(ctx, off_dev, key.dev, sizeof(key.dev));
	gfx_count(&xid_counts, &key, 1);

	ev = bpf_ringbuf_reserve(&xid_events, sizeof(*ev), 0);
	if (!ev) {
		dropped = bpf_map_lookup_elem(&xid_dropped, &zero);
		if (dropped)
			__sync_fetch_and_add(dropped, 1);
		return 0;
	}
	fill_event(ev, ctx, &key);
	bpf_ringbuf_submit(ev, 0);
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
