/* qwen2 against tests/fixtures/qwen2: see test_model_common.h for what is
 * compared and the tolerances. */
#define FIXTURE_ARCH "qwen2"
#include "test_model_common.h"

int main(int argc, char **argv) { return fixture_main(argc, argv); }
