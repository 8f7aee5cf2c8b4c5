/* info.h - the read-only endpoints: version, the model list, model details, what is loaded.
 *
 * Pure functions of the model card (and the worker's state for /api/ps); each returns a new cJSON
 * object (caller deletes) or NULL when out of memory. They never block and never touch the engine.
 */
#ifndef CN_INFO_H
#define CN_INFO_H

#include <cjson/cJSON.h>

#include "server/server.h"

#define CN_VERSION "0.1.0"

cJSON *cn_info_version(void);                          /* GET /api/version */
cJSON *cn_info_tags(const cn_model_card *c);           /* GET /api/tags */
cJSON *cn_info_ps(const cn_model_card *c, int busy, int waiting); /* GET /api/ps */
cJSON *cn_info_show(const cn_model_card *c);           /* POST /api/show */
cJSON *cn_info_models(const cn_model_card *c);         /* GET /v1/models */
cJSON *cn_info_model(const cn_model_card *c);          /* GET /v1/models/{id} */

#endif
