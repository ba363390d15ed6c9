/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/topo.c: the machine's topology (NUMA nodes, cores, memory) and memory binding, from
 * hwloc when built with it, else from sysconf with one NUMA node and no binding.
 */
#include <stdlib.h>
#include <unistd.h>

#include "common/util.h"

#if ZINF_HAVE_HWLOC
#include <hwloc.h>
#endif

struct zinf_topo {
	int numa_nodes;
	int cores;
	int pus;
	uint64_t memory; /* bytes */
#if ZINF_HAVE_HWLOC
	hwloc_topology_t hw; /* NULL when hwloc failed to load: sysconf numbers stand */
#endif
};

int
zinf_topo_create(struct zinf_topo **out)
{
	struct zinf_topo *t = zc_calloc(1, sizeof(*t));
	if (!t) {
		return ZINF_FAIL(-ENOMEM, "topology: out of memory");
	}
	long pus = sysconf(_SC_NPROCESSORS_ONLN);
	long pages = sysconf(_SC_PHYS_PAGES);
	long psz = sysconf(_SC_PAGESIZE);
	t->numa_nodes = 1;
	t->pus = pus > 0 ? (int)pus : 1;
	t->cores = t->pus;
	t->memory = (pages > 0 && psz > 0) ? (uint64_t)pages * (uint64_t)psz : 0;
#if ZINF_HAVE_HWLOC
	if (hwloc_topology_init(&t->hw) == 0 && hwloc_topology_load(t->hw) == 0) {
		int n = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_NUMANODE);
		int c = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_CORE);
		int p = hwloc_get_nbobjs_by_type(t->hw, HWLOC_OBJ_PU);
		t->numa_nodes = n > 0 ? n : 1;
		t->cores = c > 0 ? c : t->cores;
		t->pus = p > 0 ? p : t->pus;
	} else {
		ZINF_WARN("hwloc could not load the topology: assuming one NUMA node, %d cores",
			  t->cores);
		if (t->hw) {
			hwloc_topology_destroy(t->hw);
		}
		t->hw = NULL;
	}
#endif
	*out = t;
	return 0;
}

void
zinf_topo_destroy(struct zinf_topo *t)
{
	if (!t) {
		return;
	}
#if ZINF_HAVE_HWLOC
	if (t->hw) {
		hwloc_topology_destroy(t->hw);
	}
#endif
	zc_free(t);
}

int
zinf_topo_numa_nodes(const struct zinf_topo *t)
{
	return t->numa_nodes;
}

int
zinf_topo_cores(const struct zinf_topo *t)
{
	return t->cores;
}

int
zinf_topo_pus(const struct zinf_topo *t)
{
	return t->pus;
}

uint64_t
zinf_topo_memory(const struct zinf_topo *t)
{
	return t->memory;
}

int
zinf_topo_bind_area(struct zinf_topo *t, void *p, size_t len, int node)
{
	if (node < 0 || node >= t->numa_nodes) {
		return ZINF_FAIL(-EINVAL, "bind memory: NUMA node %d out of range (machine has %d)",
				 node, t->numa_nodes);
	}
#if ZINF_HAVE_HWLOC
	if (!t->hw) {
		return -ENODEV;
	}
	hwloc_obj_t obj = hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_NUMANODE, (unsigned)node);
	if (!obj) {
		return ZINF_FAIL(-EINVAL, "bind memory: NUMA node %d not found", node);
	}
	if (hwloc_set_area_membind(t->hw, p, len, obj->nodeset, HWLOC_MEMBIND_BIND,
				   HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_MIGRATE) != 0) {
		int e = errno ? errno : EIO;
		return ZINF_FAIL(-e, "bind %zu bytes to NUMA node %d: %s", len, node,
				 zinf_strerror(-e));
	}
	return 0;
#else
	return -ENODEV;
#endif
}
