/* mistral against tests/fixtures/mistral: see test_model_common.h for what is
 * compared and the tolerances. */
#define FIXTURE_ARCH "mistral"
#include "test_model_common.h"

int main(int argc, char **argv) { return fixture_main(argc, argv); }
