/* Every part of the registry at once, for the white-box checks of tests/unit/regaudit.h: the parts
 * themselves include only the headers of the parts they use (registry-core.h and its siblings). */
#pragma once

#include "registry-claims.h"
#include "registry-core.h"
#include "registry-rings-core.h"
#include "registry-subs.h"
#include "registry-waits.h"
