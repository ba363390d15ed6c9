/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config_engine.c: an engine from a ds_config.json in one call
 * (zinf_engine_create_from_file): the reader, then zinf_engine_create() with the engine options
 * it filled. The engine copies every string it keeps (the nvme paths), so the configuration is
 * freed before returning.
 */
#include <errno.h>

#include "common/util.h"
#include "zinf/config.h"

int
zinf_engine_create_from_file(const char *path, const struct zinf_config_inputs *inputs,
			     struct zinf_engine **out)
{
	if (!path || !out) {
		return ZINF_FAIL(-EINVAL, "zinf_engine_create_from_file: NULL %s",
				 !path ? "path" : "out");
	}
	struct zinf_train_config c;
	zinf_config_init(&c);
	int ret = zinf_config_read_file(path, inputs, &c);
	if (ret == 0) {
		ret = zinf_engine_create(&c.engine, out);
	}
	zinf_config_fini(&c);
	return ret;
}
