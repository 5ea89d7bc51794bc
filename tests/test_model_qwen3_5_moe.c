/* qwen3_5_moe against tests/fixtures/qwen3_5_moe: see test_model_common.h for what is
 * compared and the tolerances. */
#define FIXTURE_ARCH "qwen3_5_moe"
#include "test_model_common.h"

int main(int argc, char **argv) { return fixture_main(argc, argv); }
