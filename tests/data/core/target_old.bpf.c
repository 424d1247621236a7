/* A stand-in "kernel" for the CO-RE unit tests: only its BTF is used.
 * The older layout: task_struct has state (not __state), pid first, no
 * anonymous struct, prio and nice as plain fields; rq_state has RQ_OLD;
 * no only_new; u_thing is a struct, so it does not match the union. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

struct mm_struct {
	unsigned long total_vm;
};

struct task_struct {
	int pid;
	long state;
	int anon_b;
	char comm[8];
	unsigned char prio;
	unsigned short nice : 9;
	struct mm_struct *mm;
	unsigned long usage;
	long weight;
};

enum rq_state { RQ_IDLE = 1, RQ_OLD = 2, RQ_BUSY = 3 };

struct u_thing {
	int a;
};

struct amb {
	int x;
};

struct task_struct t_task;
struct mm_struct t_mm;
enum rq_state t_rq;
struct u_thing t_u;
struct amb t_amb;

char LICENSE[] SEC("license") = "GPL";
