// SPDX-License-Identifier: GPL-2.0
/*
 * execsnoop: one ring-buffer event per successful execve().
 *
 * Two builds of the same event, one chosen per kernel (catalog variants):
 * - process_exec_btf (tp_btf): the tracepoint's typed arguments, read with
 *   CO-RE through the kernel's BTF; needs no tracefs and no format file.
 * - process_exec (tracepoint): the record's `pid` and `filename` fields at
 *   offsets the broker fills from the live format file (defaults: this
 *   machine's 6.18 layout), for kernels without BTF.
 * Both report the same values: the tracepoint's pid is p->pid and its
 * filename bprm->filename. Pointers stay in registers: no map holds one.
 */
#include "gfxbpf.h"
#include "gfxbpf_ring.h"

#define FILENAME_LEN 256

/* Event layout the client decodes (named in catalog.toml, kept in BTF). */
struct exec_event {
	__u32 pid;   /* the record's pid field */
	__u32 tgid;  /* thread group id of the task after exec */
	__u32 uid;
	__u32 gid;
	char comm[16];
	char filename[FILENAME_LEN];
};

const volatile __u32 target_uid = GFX_ANY;
const volatile __u32 off_pid = 12;      /* sched_process_exec: pid_t pid */
const volatile __u32 off_filename = 8;  /* __data_loc char[] filename */

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} events SEC(".maps");

/*
 * The fields the tp_btf build reads; CO-RE relocates each access against
 * the running kernel's BTF (so a moved field needs no rebuild).
 */
struct task_struct {
	int pid;
} __attribute__((preserve_access_index));

struct linux_binprm {
	const char *filename;
} __attribute__((preserve_access_index));

/*
 * A real subprogram (not inlined) so struct exec_event is in the object's
 * BTF through this function's prototype. Fills what both builds share.
 */
static __attribute__((noinline)) int fill_event(struct exec_event *e)
{
	__u64 uid_gid = bpf_get_current_uid_gid();

	/* Reserved ring memory holds older records: no stale bytes after NULs. */
	__builtin_memset(e, 0, sizeof(*e));
	e->tgid = bpf_get_current_pid_tgid() >> 32;
	e->uid = (__u32)uid_gid;
	e->gid = uid_gid >> 32;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	return 0;
}

/* sched_process_exec(struct task_struct *p, pid_t old_pid, struct linux_binprm *bprm) */
SEC("tp_btf/sched_process_exec")
int process_exec_btf(unsigned long long *ctx)
{
	struct task_struct *p = (void *)ctx[0];
	struct linux_binprm *bprm = (void *)ctx[2];
	struct exec_event *e;

	if (!gfx_uid_ok(target_uid))
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	fill_event(e);
	/* Typed pointers: direct (CO-RE relocated) loads, no probe_read call. */
	e->pid = p->pid;
	bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), bprm->filename);
	gfx_ringbuf_submit(&events, e, sizeof(*e)); /* no wake-up per exec */
	return 0;
}

SEC("tracepoint/sched/sched_process_exec")
int process_exec(void *ctx)
{
	struct exec_event *e;

	if (!gfx_uid_ok(target_uid))
		return 0;
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e)
		return 0;
	fill_event(e);
	e->pid = gfx_ctx_u32(ctx, off_pid);
	gfx_ctx_str(ctx, off_filename, e->filename, sizeof(e->filename));
	gfx_ringbuf_submit(&events, e, sizeof(*e)); /* no wake-up per exec */
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
