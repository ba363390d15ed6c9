/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/estimate.c: `zinf estimate`: model-state memory per GPU, per node's CPU and per node's
 * NVMe for every ZeRO stage and offload choice, whether each fits the machine, the largest model
 * each choice fits, and (with bandwidths) a step-time bound per choice and a recommended
 * ds_config section. Formulas only: nothing is allocated or measured here.
 *
 * The accounting (P parameters, N = G x M GPUs, G per node, M nodes, L the largest layer's
 * parameters, f the CPU buffer factor, DeepSpeed's additional_buffer_factor, default 1.5):
 *   GPU, the ZeRO paper's: 2 bytes of 16-bit parameter, 2 of 16-bit gradient, K = 12 of fp32
 *   optimizer state (master, m, v) per parameter, each partitioned as the stage says; stage 3
 *   adds the gathered working set of the largest layer, 4 L (its 16-bit parameters and
 *   gradients, as DeepSpeed's estimate_zero3_model_states_mem_needs counts it).
 *   CPU per node, DeepSpeed's estimate_zero2/zero3_model_states_mem_needs: offloaded state is
 *   partitioned over all N GPUs, so a node holds its G partitions: 16 P / M x f for the
 *   optimizer on the CPU (fp32 master, m, v and the fp32 gradient), + 2 P / M x f for
 *   parameters on the CPU; with the optimizer on NVMe only the fp32 gradient, 4 P / M x f,
 *   stays on the CPU.
 *   NVMe per node: 12 P / M for the optimizer, 2 P / M for the parameters. With --optimizer-state
 *   and --master the optimizer's 12 (and the CPU's 16) follow its bytes (a bf16 master: 2
 *   instead of 4; with the optimizer on NVMe none, since it shares the 16-bit parameters' home,
 *   which the step reads it from); with the parameters on NVMe each
 *   GPU's engine keeps min(max_in_cpu, its partition) 16-bit elements cached in CPU memory.
 * It does not count activations, the pinned swap buffers or the framework's own memory.
 *
 * The step time (with bandwidths): the ZeRO-Infinity paper's bandwidth model with the traffic
 * overlapped, as zinf overlaps it: time = max over the links of bytes / bandwidth, and of the
 * compute. Per step and node: NVMe reads and writes of the state (12 P / M each way, or what
 * --optimizer-state says), of the parameters (2 fetches per pass of 2 P / M less each engine's
 * cache of max_in_cpu elements, one write of 2 P / M) and of the gradient window's spills
 * (nvme_bytes, below); CPU Adam over P / M
 * parameters; per GPU over PCIe: the offloaded parameters fetched (2 x 2 P / N per
 * micro-batch), the fp32 gradient partition copied out (4 P / N per micro-batch) and the new
 * 16-bit parameters copied in (2 P / N); per GPU over the network, ring bus bytes (N - 1) / N
 * of: stage 0-1 an all-reduce of the 16-bit gradients (2 x 2 P), stage 2 a reduce-scatter
 * (2 P) and the all-gather after the step (2 P), stage 3 the reduce-scatter and two
 * all-gathers per micro-batch (3 x 2 P); compute 6 P x tokens / (N x flop/s).
 */
#include <errno.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>

#include "cli/cli.h"
#include "zinf/config.h"

#define PROG "zinf estimate"
/* bytes per element of an 8-bit blockwise-quantized moment: a code, and a 4-byte scale per
   block of 256 (cpu_adam's q8 state, zinf_optimizer_state_size) */
#define Q8_BYTES (1.0 + 4.0 / 256)

enum off { OFF_NONE = 0, OFF_CPU = 1, OFF_NVME = 2 };
static const char *const off_name[] = {"none", "cpu", "nvme"};

/* One choice: a stage and where parameters and the optimizer live. */
struct choice {
	int stage;
	enum off param, optim;
};

/* Least offload first: the order in which a choice is recommended when bandwidths are absent. */
static const struct choice choices[] = {
	{0, OFF_NONE, OFF_NONE}, {1, OFF_NONE, OFF_NONE}, {2, OFF_NONE, OFF_NONE},
	{3, OFF_NONE, OFF_NONE}, {1, OFF_NONE, OFF_CPU},  {2, OFF_NONE, OFF_CPU},
	{3, OFF_NONE, OFF_CPU},	 {3, OFF_CPU, OFF_CPU},	  {2, OFF_NONE, OFF_NVME},
	{3, OFF_NONE, OFF_NVME}, {3, OFF_CPU, OFF_NVME},  {3, OFF_NVME, OFF_CPU},
	{3, OFF_NVME, OFF_NVME},
};
#define NCHOICES (sizeof(choices) / sizeof(choices[0]))

struct cfg {
	uint64_t params, layers, hidden, largest;
	uint32_t gpus, nodes, micro;
	uint64_t gpu_mem, cpu_mem, nvme;
	bool gpu_given, cpu_given, nvme_given;
	double factor;
	double nvme_read, nvme_write, pcie, net, adam, tflops;
	bool read_given, write_given, pcie_given, net_given, adam_given;
	const char *from_bench, *hf_config;
	bool params_given, largest_given;
	uint64_t tokens;
	bool json;
	/* the options that move the NVMe bytes per step (issue 23) */
	const char *state;   /* optimizer state: f32, bf16, q8 */
	uint64_t max_in_cpu; /* 16-bit parameter elements cached per GPU (offload_param) */
	bool vertical;	     /* micro-batches run layer by layer (zinf_engine's vertical pass) */
	bool no_sdb;	     /* step_during_backward off */
	const char *master;  /* the master weight: f32, bf16 */
};

static struct cfg cfg;

static const char synopsis[] =
	"(--params P [--layers L --hidden H] | --hf-config FILE) [--gpus-per-node G] [--nodes M]\n"
	"       [--gpu-mem B --cpu-mem B --nvme B] [--nvme-read-bw GBps --nvme-write-bw GBps\n"
	"       --pcie-bw GBps --net-bw GBps --adam-rate P/s --tokens T --gpu-tflops F] [--json]";
static const char description[] =
	"Model-state memory per GPU, per node's CPU and per node's NVMe for ZeRO stages 0-3 and\n"
	"each offload choice; whether each fits (--gpu-mem per GPU, --cpu-mem and --nvme per "
	"node;\n"
	"defaults: 80 GB, this machine's memory, the free space here); the largest model each\n"
	"choice fits. GPU bytes follow the ZeRO paper (2 + 2 + 12 bytes per parameter, "
	"partitioned\n"
	"by the stage; stage 3 adds 4 x the largest layer), CPU bytes DeepSpeed's\n"
	"estimate_zero2/zero3_model_states_mem_needs (16 or 18 bytes per parameter offloaded, x\n"
	"--buffer-factor), NVMe 12 bytes (optimizer; --optimizer-state) and 2 (parameters). The\n"
	"NVMe bytes per parameter per step of each row: the state read and written once, the\n"
	"parameters written once and read twice per micro-batch (once per step with --vertical)\n"
	"less each engine's cache (--max-in-cpu), the gradient window's spills. The largest layer "
	"is\n"
	"12 H^2 with --hidden, P / L with --layers only, --largest-layer if given. With\n"
	"bandwidths, a step-time bound per choice (the traffic overlapped: the slowest link) and\n"
	"the fastest choice that fits, printed as a ds_config section. Without --layers,\n"
	"--hidden or --largest-layer the largest layer is 0 (said). Exit 0: a choice fits; 1:\n"
	"nothing fits (as `zinf config check`); 2: a usage error.\n";

static const struct cli_opt opts[] = {
	{"params", CLI_COUNT, &cfg.params, NULL, "P",
	 "model parameters (required without --hf-config)", .min = 1, .max = 1e15,
	 .given = &cfg.params_given},
	{"hf-config", CLI_STR, &cfg.hf_config, NULL, "FILE",
	 "a Hugging Face config.json (or its directory): parameters, layers, hidden size and the "
	 "largest layer from it (gpt2, llama, mistral, qwen2)"},
	{"layers", CLI_COUNT, &cfg.layers, "0", "L", "transformer layers (largest layer P / L)",
	 .max = 1e9},
	{"hidden", CLI_COUNT, &cfg.hidden, "0", "H", "hidden size (largest layer 12 H^2)",
	 .max = 1e7},
	{"largest-layer", CLI_COUNT, &cfg.largest, "0", "N", "parameters of the largest layer",
	 .max = 1e15, .given = &cfg.largest_given},
	{"gpus-per-node", CLI_U32, &cfg.gpus, "1", "G", "GPUs per node", .min = 1, .max = 1 << 20},
	{"nodes", CLI_U32, &cfg.nodes, "1", "M", "nodes", .min = 1, .max = 1 << 20},
	{"micro-batches", CLI_U32, &cfg.micro, "1", "N",
	 "micro-batches per step (gradient_accumulation_steps)", .min = 1, .max = 1 << 20},
	{"gpu-mem", CLI_SIZE, &cfg.gpu_mem, "80G", "B", "memory per GPU", .min = 1,
	 .given = &cfg.gpu_given},
	{"cpu-mem", CLI_SIZE, &cfg.cpu_mem, "0", "B",
	 "CPU memory per node (default: this machine's)", .given = &cfg.cpu_given},
	{"nvme", CLI_SIZE, &cfg.nvme, "0", "B", "NVMe per node (default: free space here)",
	 .given = &cfg.nvme_given},
	{"buffer-factor", CLI_DOUBLE, &cfg.factor, "1.5", "F",
	 "CPU bytes x F (DeepSpeed's additional_buffer_factor)", .min = 1, .max = 100},
	{"nvme-read-bw", CLI_DOUBLE, &cfg.nvme_read, "0", "GBps", "NVMe read bandwidth per node",
	 .min = 0, .max = 1e6, .given = &cfg.read_given},
	{"nvme-write-bw", CLI_DOUBLE, &cfg.nvme_write, "0", "GBps",
	 "NVMe write bandwidth per node (default: the read bandwidth)", .min = 0, .max = 1e6,
	 .given = &cfg.write_given},
	{"pcie-bw", CLI_DOUBLE, &cfg.pcie, "0", "GBps", "host-device bandwidth per GPU", .min = 0,
	 .max = 1e6, .given = &cfg.pcie_given},
	{"net-bw", CLI_DOUBLE, &cfg.net, "0", "GBps", "collective bus bandwidth per GPU", .min = 0,
	 .max = 1e6, .given = &cfg.net_given},
	{"adam-rate", CLI_DOUBLE, &cfg.adam, "0", "P/s", "CPU-Adam parameters per second per node",
	 .min = 0, .max = 1e15, .given = &cfg.adam_given},
	{"tokens", CLI_COUNT, &cfg.tokens, "0", "T", "tokens per step (all GPUs), for compute time",
	 .max = 1e15},
	{"gpu-tflops", CLI_DOUBLE, &cfg.tflops, "0", "F", "achieved TFLOP/s per GPU", .min = 0,
	 .max = 1e6},
	{"from-bench", CLI_STR, &cfg.from_bench, NULL, "FILE",
	 "bandwidths from `zinf bench all --out FILE` (the flags above win)"},
	{"optimizer-state", CLI_STR, &cfg.state, "f32", "f32|bf16|q8",
	 "the optimizer's state after the fp32 master: fp32 m and v (12 bytes per parameter with "
	 "the master), bf16 (8), 8-bit blockwise (q8)"},
	{"max-in-cpu", CLI_COUNT, &cfg.max_in_cpu, "1e9", "N",
	 "offload_param.max_in_cpu: 16-bit parameter elements each GPU's engine keeps in CPU "
	 "memory (its parameter cache; the engine's default)",
	 .max = 1e15},
	{"vertical", CLI_FLAG, &cfg.vertical, NULL, NULL,
	 "the trainer runs its micro-batches layer by layer (the parameters read once per step, "
	 "not once per micro-batch)"},
	{"no-step-during-backward", CLI_FLAG, &cfg.no_sdb, NULL, NULL,
	 "step_during_backward off: every gradient waits in the gradient window (on NVMe with the "
	 "optimizer there) until the step"},
	{"json", CLI_FLAG, &cfg.json, NULL, NULL, "one JSON object on stdout"},
	{"master", CLI_STR, &cfg.master, "f32", "f32|bf16",
	 "the master weight: fp32 (4 bytes per parameter) or bf16 (2, stochastic rounding; "
	 "optimizer.params.zinf_master_weights); the estimate takes bf16 parameters, whose home a "
	 "bf16 master on NVMe shares (with fp32 parameters it keeps its 2 bytes there)"},
	{NULL},
};

/* The optimizer's state bytes per parameter, the master included (--optimizer-state, --master).
 */
static double
state_bytes(const struct cfg *c)
{
	double master = !strcmp(c->master, "bf16") ? 2 : 4;
	if (!strcmp(c->state, "bf16")) {
		return master + 2 + 2;
	}
	if (!strcmp(c->state, "q8")) {
		return master + 2 * Q8_BYTES;
	}
	return master + 4 + 4;
}

/* Whether a bf16 master shares the 16-bit parameters' home (eng_master_shared): the optimizer on
 * NVMe, but not with the parameters on NVMe and no parameter cache (engine/README.md). */
static bool
master_shared(const struct choice *ch, const struct cfg *c)
{
	return ch->optim == OFF_NVME && !strcmp(c->master, "bf16") &&
	       !(ch->param == OFF_NVME && c->max_in_cpu == 0);
}

/* The optimizer's bytes per parameter in its files: without a shared master's 2. */
static double
file_state_bytes(const struct choice *ch, const struct cfg *c)
{
	return state_bytes(c) - (master_shared(ch, c) ? 2 : 0);
}

/*
 * Why the choices with the optimizer on the GPU (offload_optimizer none) are left out, or NULL:
 * the engine steps a bf16 master and q8 state on the CPU only, and refuses them with
 * offload_optimizer.device none (engine.c, zinf_engine_create).
 */
static const char *
gpu_optim_refused(const struct cfg *c)
{
	bool bm = !strcmp(c->master, "bf16"), q8 = !strcmp(c->state, "q8");
	return bm && q8 ? "--master bf16 and --optimizer-state q8 are stepped on the CPU only"
	       : bm	? "--master bf16 is stepped on the CPU only"
	       : q8	? "--optimizer-state q8 is stepped on the CPU only"
			: NULL;
}

/* Bytes of one choice: a P + b per resource, with L folded in by the caller. */
struct need {
	double gpu, cpu, nvme;
};

/* Bytes per GPU / per node for P parameters and a largest layer of L parameters. */
static struct need
need_of(const struct choice *ch, const struct cfg *c, double P, double L)
{
	double N = (double)c->gpus * c->nodes, M = c->nodes, f = c->factor;
	struct need n = {0, 0, 0};
	double p16 = 2 * P, g16 = 2 * P, os = state_bytes(c) * P;
	switch (ch->stage) {
	case 0:
		n.gpu = p16 + g16 + os;
		break;
	case 1:
		n.gpu = p16 + g16 + (ch->optim == OFF_NONE ? os / N : 0);
		break;
	case 2:
		n.gpu = p16 + g16 / N + (ch->optim == OFF_NONE ? os / N : 0);
		break;
	default:
		n.gpu = 4 * L + (ch->param == OFF_NONE ? p16 / N : 0) +
			(ch->optim == OFF_NONE ? (g16 + os) / N : 0);
		break;
	}
	if (ch->optim == OFF_CPU) {
		n.cpu += (state_bytes(c) + 4) * P / M * f;
	} else if (ch->optim == OFF_NVME) {
		n.cpu += 4 * P / M * f;
		n.nvme += file_state_bytes(ch, c) * P / M;
	}
	if (ch->param == OFF_CPU) {
		n.cpu += 2 * P / M * f;
	} else if (ch->param == OFF_NVME) {
		n.nvme += 2 * P / M;
		/* each GPU's engine: its parameter cache, at most its partition */
		n.cpu += N / M * 2 * fmin((double)c->max_in_cpu, P / N);
	}
	return n;
}

/* The largest layer for P parameters: fixed (--largest-layer, --hidden), P / L, or 0. */
static double
largest_of(const struct cfg *c, double P)
{
	if (c->largest) {
		return (double)c->largest;
	}
	if (c->hidden) {
		return 12.0 * (double)c->hidden * (double)c->hidden;
	}
	return c->layers ? P / (double)c->layers : 0;
}

static bool
fits(const struct need *n, const struct cfg *c)
{
	return n->gpu <= (double)c->gpu_mem && n->cpu <= (double)c->cpu_mem &&
	       n->nvme <= (double)c->nvme;
}

/* The largest P that fits where every need is affine in P between p0 and p1 (extended past
 * them): each resource's bound is (cap - need(0)) / slope; the least of them. */
static double
largest_affine(const struct choice *ch, const struct cfg *c, double p0, double p1)
{
	struct need n0 = need_of(ch, c, p0, largest_of(c, p0));
	struct need n1 = need_of(ch, c, p1, largest_of(c, p1));
	double caps[3] = {(double)c->gpu_mem, (double)c->cpu_mem, (double)c->nvme};
	double a[3] = {(n1.gpu - n0.gpu) / (p1 - p0), (n1.cpu - n0.cpu) / (p1 - p0),
		       (n1.nvme - n0.nvme) / (p1 - p0)};
	double b[3] = {n0.gpu - a[0] * p0, n0.cpu - a[1] * p0, n0.nvme - a[2] * p0};
	double best = INFINITY;
	for (int i = 0; i < 3; i++) {
		if (b[i] > caps[i]) {
			return 0;
		}
		if (a[i] > 0) {
			best = fmin(best, (caps[i] - b[i]) / a[i]);
		}
	}
	return isfinite(best) ? floor(best) : 0;
}

/*
 * The largest P that fits. Every need is affine in P (the largest layer fixed or P / L) but
 * the parameter cache of a choice with the parameters on NVMe, which grows with each GPU's
 * partition up to max_in_cpu elements and then stays: two affine pieces, meeting where the
 * partitions reach the cache, B = N x max_in_cpu. The piece past B if its answer lies past B,
 * else the piece below it.
 */
static double
largest_model(const struct choice *ch, const struct cfg *c)
{
	double B = (double)c->gpus * c->nodes * (double)c->max_in_cpu;
	if (ch->param != OFF_NVME || B <= 0 || B > 1e18) {
		return largest_affine(ch, c, 0, 1e9);
	}
	double past = largest_affine(ch, c, B, 2 * B);
	return past >= B ? past : largest_affine(ch, c, 0, B);
}

/* NVMe bytes per step and node of one choice, by kind and direction. */
struct nvme_bytes {
	double param_rd, param_wr, optim_rd, optim_wr, grad_rd, grad_wr;
};

/*
 * The optimizer's state is read and written once per step. The gradient window (the optimizer
 * on NVMe) holds a few sub-groups: a micro-batch before the boundary leaves each sub-group's
 * fp32 gradient on NVMe and the next reads it back (4 bytes each way per micro-batch after the
 * first), and so does the boundary's when the step waits for the end of backward; with the
 * step during backward the boundary's gradients go to the optimizer directly, and in a
 * vertical pass every micro-batch's gradient of a sub-group arrives while it holds its slot
 * (the sub-groups are taken to outnumber the window's slots, as in any model worth
 * offloading). The 16-bit parameters are written once and read twice per pass (forward and
 * backward; a pass per micro-batch, one for a vertical pass), less what each engine's cache
 * holds (max_in_cpu elements of its partition, which serve both fetches of a pass).
 */
static struct nvme_bytes
nvme_bytes(const struct choice *ch, const struct cfg *c)
{
	double P = (double)c->params, N = (double)c->gpus * c->nodes, M = c->nodes;
	double mb = c->micro;
	struct nvme_bytes b = {0, 0, 0, 0, 0, 0};
	if (ch->optim == OFF_NVME) {
		b.optim_rd = b.optim_wr = file_state_bytes(ch, c) * P / M;
		double spills = (c->vertical ? 0 : mb - 1) + (c->no_sdb ? 1 : 0);
		b.grad_rd = b.grad_wr = spills * 4 * P / M;
	}
	if (ch->param == OFF_NVME) {
		double part = P / N, uncached = part - fmin((double)c->max_in_cpu, part);
		double passes = c->vertical ? 1 : mb;
		b.param_rd = passes * 2 * 2 * uncached * N / M;
		b.param_wr = 2 * P / M;
		if (master_shared(ch, c)) {
			/* the shared master is read from the parameters' home before the step of
			   its sub-group: during backward, just after backward fetched it (cached
			   with any cache); after backward, in backward's order, which LRU misses
			   unless the whole partition is cached */
			b.param_rd += c->no_sdb && uncached > 0 ? 2 * P / M : 0;
		}
	}
	return b;
}

/* Seconds per step of one choice: the slowest link; -1 when no bandwidth was given. */
struct times {
	double nvme, pcie, net, adam, compute, step;
};

static struct times
step_time(const struct choice *ch, const struct cfg *c)
{
	double P = (double)c->params, N = (double)c->gpus * c->nodes, M = c->nodes;
	double mb = c->micro;
	struct times t = {0, 0, 0, 0, 0, -1};
	double h2d = 0, d2h = 0, net = 0;
	struct nvme_bytes nb = nvme_bytes(ch, c);
	double rd = nb.param_rd + nb.optim_rd + nb.grad_rd;
	double wr = nb.param_wr + nb.optim_wr + nb.grad_wr;
	if (ch->param != OFF_NONE) {
		h2d += (c->vertical ? 1 : mb) * 2 * 2 * P / N;
	}
	if (ch->optim != OFF_NONE) {
		d2h += mb * 4 * P / N;
		h2d += 2 * P / N;
	}
	double ring = (N - 1) / N;
	switch (ch->stage) {
	case 0:
	case 1:
		net = mb * 2 * 2 * P * ring + (ch->stage == 1 ? 2 * P * ring : 0);
		break;
	case 2:
		net = (mb * 2 * P + 2 * P) * ring;
		break;
	default:
		net = mb * 3 * 2 * P * ring;
		break;
	}
	double wbw = c->nvme_write > 0 ? c->nvme_write : c->nvme_read;
	/* With any bandwidth or compute given, a link that carries nothing costs 0. */
	bool any = c->nvme_read > 0 || c->pcie > 0 || c->net > 0 || c->adam > 0 ||
		   (c->tokens && c->tflops > 0);
	if (rd + wr > 0 && c->nvme_read > 0) {
		t.nvme = rd / (c->nvme_read * 1e9) + wr / (wbw * 1e9);
	}
	if (h2d + d2h > 0 && c->pcie > 0) {
		t.pcie = fmax(h2d, d2h) / (c->pcie * 1e9); /* full duplex */
	}
	if (N > 1 && c->net > 0) {
		t.net = net / (c->net * 1e9);
	}
	if (ch->optim != OFF_NONE && c->adam > 0) {
		t.adam = P / M / c->adam;
	}
	if (c->tokens && c->tflops > 0) {
		t.compute = 6 * P * (double)c->tokens / (N * c->tflops * 1e12);
	}
	if (any) {
		t.step = fmax(fmax(fmax(t.nvme, t.pcie), fmax(t.net, t.adam)), t.compute);
	}
	return t;
}

/* The ds_config zero_optimization section of a choice, as JSON. */
static json_t *
ds_section(const struct choice *ch)
{
	json_t *z = json_object();
	json_object_set_new(z, "stage", json_integer(ch->stage));
	if (ch->optim != OFF_NONE) {
		json_t *o = json_pack("{s:s, s:b}", "device", off_name[ch->optim], "pin_memory", 1);
		if (ch->optim == OFF_NVME) {
			json_object_set_new(o, "nvme_path", json_string("/local_nvme"));
		}
		json_object_set_new(z, "offload_optimizer", o);
	}
	if (ch->param != OFF_NONE) {
		json_t *o = json_pack("{s:s, s:b}", "device", off_name[ch->param], "pin_memory", 1);
		if (ch->param == OFF_NVME) {
			json_object_set_new(o, "nvme_path", json_string("/local_nvme"));
		}
		json_object_set_new(z, "offload_param", o);
	}
	return json_pack("{s:o}", "zero_optimization", z);
}

/* Fill the machine defaults: this machine's memory, the free space of the current directory. */
static int
machine_defaults(struct cfg *c)
{
	if (!c->cpu_given) {
		c->cpu_mem = cli_phys_memory();
	}
	if (!c->nvme_given) {
		struct statvfs v;
		if (statvfs(".", &v) != 0) {
			fprintf(stderr, PROG ": statvfs(.): %s; give --nvme\n", strerror(errno));
			return -1;
		}
		c->nvme = (uint64_t)v.f_bavail * v.f_frsize;
	}
	return 0;
}

/* The bandwidths of a `zinf bench all` profile, where no flag gave them. */
static int
from_bench(struct cfg *c)
{
	json_error_t jerr;
	json_t *o = json_load_file(c->from_bench, 0, &jerr);
	if (!o) {
		fprintf(stderr, PROG ": --from-bench %s: line %d column %d: %s\n", c->from_bench,
			jerr.line, jerr.column, jerr.text);
		return -1;
	}
	if (!json_is_object(o)) {
		fprintf(stderr, PROG ": --from-bench %s: not a `zinf bench all` profile\n",
			c->from_bench);
		json_decref(o);
		return -1;
	}
	static const struct {
		const char *key;
		size_t off, given;
	} keys[] = {
		{"nvme_read_GBps", offsetof(struct cfg, nvme_read),
		 offsetof(struct cfg, read_given)},
		{"nvme_write_GBps", offsetof(struct cfg, nvme_write),
		 offsetof(struct cfg, write_given)},
		{"pcie_GBps", offsetof(struct cfg, pcie), offsetof(struct cfg, pcie_given)},
		{"net_busbw_GBps", offsetof(struct cfg, net), offsetof(struct cfg, net_given)},
		{"adam_params_per_s", offsetof(struct cfg, adam), offsetof(struct cfg, adam_given)},
	};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		json_t *v = json_object_get(o, keys[i].key);
		bool *given = (bool *)((char *)c + keys[i].given);
		if (json_is_number(v) && json_number_value(v) > 0 && !*given) {
			*(double *)((char *)c + keys[i].off) = json_number_value(v);
		}
	}
	json_decref(o);
	return 0;
}

static void
gb(char *out, size_t n, double bytes)
{
	snprintf(out, n, "%.2f GiB", bytes / (double)(1ull << 30));
}

/* --hf-config: the model's parameters, layers, hidden size and largest layer from its
   config.json (zinf_hf_model_read); --params with it is refused, --largest-layer wins. */
static int
from_hf(struct cfg *c)
{
	struct zinf_hf_model m = {.size = sizeof(m)};
	if (c->params_given) {
		fprintf(stderr,
			PROG ": --params and --hf-config: give one (the file counts them)\n");
		return -EINVAL;
	}
	if (zinf_hf_model_read(c->hf_config, &m) < 0) {
		fprintf(stderr, PROG ": --hf-config %s: %s\n", c->hf_config, zinf_last_error());
		return -EINVAL;
	}
	c->params = m.params;
	c->layers = m.layers;
	c->hidden = m.hidden;
	c->largest = c->largest_given ? c->largest : m.largest_layer;
	if (!c->json) {
		printf("%s (%s): %llu parameters, %llu layers, hidden %llu, largest layer %llu\n",
		       c->hf_config, m.model_type, (unsigned long long)m.params,
		       (unsigned long long)m.layers, (unsigned long long)m.hidden,
		       (unsigned long long)c->largest);
	}
	return 0;
}

int
cli_estimate(int argc, char **argv)
{
	int rc = cli_opts_main(PROG, synopsis, description, opts, argc, argv);
	if (rc >= 0) {
		return rc;
	}
	struct cfg c = cfg;
	if (c.hf_config && from_hf(&c) < 0) {
		return 2;
	}
	if (strcmp(c.state, "f32") && strcmp(c.state, "bf16") && strcmp(c.state, "q8")) {
		fprintf(stderr, PROG ": --optimizer-state %s: f32, bf16 or q8\n", c.state);
		return 2;
	}
	if (strcmp(c.master, "f32") && strcmp(c.master, "bf16")) {
		fprintf(stderr, PROG ": --master %s: f32 or bf16\n", c.master);
		return 2;
	}
	if (!c.params_given && !c.hf_config) {
		fprintf(stderr, PROG ": --params P (or --hf-config FILE) is required\nrun `" PROG
				     " --help`\n");
		return 2;
	}
	if (machine_defaults(&c) < 0 || (c.from_bench && from_bench(&c) < 0)) {
		return 1;
	}
	double P = (double)c.params, L = largest_of(&c, P);
	json_t *rows = json_array();
	int best = -1;
	double best_t = INFINITY;
	const char *refused = gpu_optim_refused(&c);
	size_t row_choice[NCHOICES], nrows = 0; /* the choice of each row */
	for (size_t i = 0; i < NCHOICES; i++) {
		const struct choice *ch = &choices[i];
		if (refused && ch->optim == OFF_NONE) {
			continue; /* the engine would refuse it */
		}
		row_choice[nrows++] = i;
		struct need n = need_of(ch, &c, P, L);
		struct times t = step_time(ch, &c);
		bool ok = fits(&n, &c);
		if (ok && best < 0) {
			best = (int)i; /* least offload that fits */
		}
		if (ok && t.step >= 0 && t.step < best_t) {
			best_t = t.step;
			best = (int)i;
		}
		json_t *r =
			json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:b, s:I}", "stage", ch->stage,
				  "offload_param", off_name[ch->param], "offload_optimizer",
				  off_name[ch->optim], "gpu_bytes", (json_int_t)ceil(n.gpu),
				  "cpu_bytes_per_node", (json_int_t)ceil(n.cpu),
				  "nvme_bytes_per_node", (json_int_t)ceil(n.nvme), "fits", ok,
				  "largest_params", (json_int_t)largest_model(ch, &c));
		struct nvme_bytes nb = nvme_bytes(ch, &c);
		double per = c.nodes / P; /* a node's bytes -> bytes per parameter of the model */
		json_object_set_new(
			r, "nvme_bytes_per_param",
			json_pack("{s:{s:f, s:f}, s:{s:f, s:f}, s:{s:f, s:f}, s:{s:f, s:f}}",
				  "total", "read", (nb.param_rd + nb.optim_rd + nb.grad_rd) * per,
				  "written", (nb.param_wr + nb.optim_wr + nb.grad_wr) * per,
				  "param", "read", nb.param_rd * per, "written", nb.param_wr * per,
				  "optim", "read", nb.optim_rd * per, "written", nb.optim_wr * per,
				  "grad", "read", nb.grad_rd * per, "written", nb.grad_wr * per));
		if (t.step >= 0) {
			json_object_set_new(r, "step_s", cli_json_real(t.step));
			json_object_set_new(r, "nvme_s", cli_json_real(t.nvme));
			json_object_set_new(r, "pcie_s", cli_json_real(t.pcie));
			json_object_set_new(r, "net_s", cli_json_real(t.net));
			json_object_set_new(r, "adam_s", cli_json_real(t.adam));
			json_object_set_new(r, "compute_s", cli_json_real(t.compute));
		}
		json_array_append_new(rows, r);
	}
	if (c.json) {
		json_t *o = json_pack("{s:I, s:i, s:i, s:I, s:I, s:I, s:I, s:f, s:o}", "params",
				      (json_int_t)c.params, "gpus_per_node", (int)c.gpus, "nodes",
				      (int)c.nodes, "largest_layer_params", (json_int_t)L,
				      "gpu_mem", (json_int_t)c.gpu_mem, "cpu_mem_per_node",
				      (json_int_t)c.cpu_mem, "nvme_per_node", (json_int_t)c.nvme,
				      "buffer_factor", c.factor, "rows", rows);
		json_object_set_new(o, "recommended",
				    best >= 0 ? ds_section(&choices[best]) : json_null());
		json_object_set_new(o, "largest_layer_known", json_boolean(L > 0));
		json_object_set_new(o, "optimizer_on_gpu_left_out",
				    refused ? json_string(refused) : json_null());
		return cli_json_print(o, 0) || best < 0 ? 1 : 0;
	}
	char g[32], cm[32], nv[32];
	gb(g, sizeof(g), (double)c.gpu_mem);
	gb(cm, sizeof(cm), (double)c.cpu_mem);
	gb(nv, sizeof(nv), (double)c.nvme);
	printf("%.3g parameters (largest layer %.3g), %u node(s) x %u GPU(s); limits: %s per GPU, "
	       "%s CPU and %s NVMe per node\n",
	       P, L, c.nodes, c.gpus, g, cm, nv);
	if (L <= 0) {
		printf("note: no --layers, --hidden or --largest-layer: the largest layer is taken "
		       "as 0, "
		       "so the GPU column leaves out the gathered layer that stage 3 holds (a "
		       "lower "
		       "bound)\n");
	}
	printf("stage  param  optim  %12s %14s %15s  fits  %12s  %12s%s\n", "GPU", "CPU/node",
	       "NVMe/node", "largest P", "NVMe B/param", best_t < INFINITY ? "     step" : "");
	size_t i;
	json_t *r;
	json_array_foreach(rows, i, r)
	{
		const struct choice *ch = &choices[row_choice[i]];
		char a[32], b[32], d[32];
		gb(a, sizeof(a), json_number_value(json_object_get(r, "gpu_bytes")));
		gb(b, sizeof(b), json_number_value(json_object_get(r, "cpu_bytes_per_node")));
		gb(d, sizeof(d), json_number_value(json_object_get(r, "nvme_bytes_per_node")));
		json_t *tot = json_object_get(json_object_get(r, "nvme_bytes_per_param"), "total");
		char bp[32];
		snprintf(bp, sizeof(bp), "%.1f + %.1f",
			 json_number_value(json_object_get(tot, "read")),
			 json_number_value(json_object_get(tot, "written")));
		printf("%5d  %-5s  %-5s  %12s %14s %15s  %-4s  %12.3g  %12s", ch->stage,
		       off_name[ch->param], off_name[ch->optim], a, b, d,
		       json_is_true(json_object_get(r, "fits")) ? "yes" : "no",
		       json_number_value(json_object_get(r, "largest_params")), bp);
		json_t *s = json_object_get(r, "step_s");
		if (s) {
			printf("  %7.3f s", json_number_value(s));
		}
		printf("\n");
	}
	json_decref(rows);
	if (refused) {
		printf("note: no rows with the optimizer on the GPU (offload_optimizer none): %s\n",
		       refused);
	}
	if (best < 0) {
		printf("nothing fits: add GPUs or nodes, CPU memory or NVMe\n");
		return 1; /* as `zinf config check` for a plan that does not fit */
	}
	printf("recommended (%s):\n",
	       best_t < INFINITY ? "the fastest that fits" : "the least offload that fits");
	return cli_json_print(ds_section(&choices[best]), 2) ? 1 : 0;
}
