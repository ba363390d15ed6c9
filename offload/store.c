// SPDX-License-Identifier: Apache-2.0
/* offload/store.c: placeholder (being written). */
#include "common/util.h"
#include "zinf/offload.h"
