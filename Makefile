# sanctum: plain make. `make` builds libsanctum, the server and the tools into
# build/; `make test` builds and runs the CPU test suite; CUDA is built when
# nvcc is found (SN_CUDA=0 forces a CPU-only build).

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
SN_CUDA ?= $(if $(NVCC),1,0)
BUILD   ?= build
OPT     ?= -O2 -g

CFLAGS_BASE = -std=c17 -D_GNU_SOURCE $(OPT) -Wall -Wextra -Werror -Wno-unused-parameter \
              -Iinclude -Isrc -pthread -fno-strict-aliasing
CFLAGS  += $(CFLAGS_BASE) $(EXTRA_CFLAGS)
LDLIBS  += -lm -lpthread -ljansson -lpcre2-8 -lutf8proc -lssl -lcrypto -levent -levent_openssl -levent_pthreads -ldl

# SIMD flags per file: the binary still runs on any x86-64; kernels are chosen at run time.
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c
VNNI_FLAGS   = -mavx512vnni

LIB_DIRS   = src/core src/io src/tok src/tensor src/backend src/models src/engine
LIB_SRC    = $(shell find $(LIB_DIRS) -name '*.c' 2>/dev/null | sort)
SERVER_SRC = $(filter-out src/server/main.c,$(wildcard src/server/*.c))
TOOLS      = $(patsubst tools/%.c,$(BUILD)/%,$(wildcard tools/*.c))
TESTS      = $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c))

LIB_OBJ    = $(patsubst %.c,$(BUILD)/obj/%.o,$(LIB_SRC))
SERVER_OBJ = $(patsubst %.c,$(BUILD)/obj/%.o,$(SERVER_SRC))

ifeq ($(SN_CUDA),1)
CU_SRC  = $(wildcard src/backend/cuda/*.cu)
CU_OBJ  = $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVCCFLAGS ?= -O3 -std=c++17 -arch=sm_90 -lineinfo -Iinclude -Isrc -Xcompiler -fPIC,-Wall
CFLAGS  += -DSN_HAVE_CUDA=1
LDLIBS  += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/targets/x86_64-linux/lib -lcudart_static -lrt -lstdc++
endif

.PHONY: all lib tools server test test-cuda bench clean fuzz cpu-cflags
all: $(BUILD)/libsanctum.a $(BUILD)/sanctum-mlx $(TOOLS)

lib: $(BUILD)/libsanctum.a
$(BUILD)/libsanctum.a: $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(@D)
	@rm -f $@   # rebuilt whole, so a deleted source leaves no stale member behind
	ar rcs $@ $^

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(if $(findstring _avx512,$<),$(AVX512_FLAGS) $(if $(findstring _vnni,$<),$(VNNI_FLAGS)),$(if $(findstring _avx2,$<),$(AVX2_FLAGS))) -MMD -MP -c $< -o $@

# -MMD -MP as for C: a header change (cuda_internal.h's cu_devinfo) must
# rebuild every .cu that includes it, or objects disagree on its layout
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/sanctum-mlx: $(BUILD)/obj/src/server/main.o $(SERVER_OBJ) $(BUILD)/libsanctum.a
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%: tools/%.c $(SERVER_OBJ) $(BUILD)/libsanctum.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(SERVER_OBJ) $(BUILD)/libsanctum.a $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(wildcard tests/*.h) $(SERVER_OBJ) $(BUILD)/libsanctum.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(SERVER_OBJ) $(BUILD)/libsanctum.a $(LDLIBS)

# The whole CPU suite: unit tests, then the shell suites (server e2e, tools).
test: all $(TESTS)
	./tests/run_all.sh $(BUILD)

test-cuda: all $(TESTS)
	SANCTUM_TEST_CUDA=1 ./tests/run_all.sh $(BUILD) cuda

# Benchmarks: bench/bench_X.c -> build/bench/bench_X; `make bench` builds them all.
BENCHES    = $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/bench_*.c))
bench: $(BENCHES)
$(BUILD)/bench/%: bench/%.c $(wildcard bench/*.h) $(SERVER_OBJ) $(BUILD)/libsanctum.a
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -o $@ $< $(SERVER_OBJ) $(BUILD)/libsanctum.a $(LDLIBS)

clean:
	rm -rf $(BUILD)

# libFuzzer targets over the parsers that take untrusted bytes, built with
# clang under ASan + UBSan into $(BUILD)/fuzz/ (tests/fuzz/README.md: how to
# run them); fuzz_tok loads build/fuzz/tokenizer.json. The one build recipe:
# the targets' headers and the README point here.
FUZZ_CC     ?= clang
FUZZ_CFLAGS  = -g -O1 -fsanitize=fuzzer,address,undefined -std=c17 -D_GNU_SOURCE -Iinclude -Isrc
FUZZERS      = $(patsubst tests/fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_SRC_fuzz_auth         = src/server/auth.c src/server/tls.c src/core/status.c
FUZZ_LIB_fuzz_auth         = -lssl -lcrypto -levent -levent_openssl
FUZZ_SRC_fuzz_config       = src/io/config.c src/io/manifest.c src/tensor/dtype.c src/tensor/quant.c src/core/status.c
FUZZ_LIB_fuzz_config       = -ljansson -lcrypto -lpthread -lm
FUZZ_SRC_fuzz_manifest     = src/io/manifest.c src/core/status.c
FUZZ_LIB_fuzz_manifest     = -lcrypto -lpthread
FUZZ_SRC_fuzz_request      = src/server/api.c src/engine/sample.c src/core/status.c
FUZZ_LIB_fuzz_request      = -ljansson -lm
FUZZ_SRC_fuzz_safetensors  = src/io/safetensors.c src/io/manifest.c src/tensor/dtype.c src/core/status.c
FUZZ_LIB_fuzz_safetensors  = -ljansson -lcrypto -lpthread
FUZZ_SRC_fuzz_tok          = $(wildcard src/tok/[a-z]*.c) src/core/status.c
FUZZ_LIB_fuzz_tok          = -ljansson -lpcre2-8 -lutf8proc -lpthread
fuzz: $(FUZZERS) $(BUILD)/fuzz/tokenizer.json
.SECONDEXPANSION:
$(BUILD)/fuzz/%: tests/fuzz/%.c $$(FUZZ_SRC_$$*) $(wildcard include/sanctum/*.h) $(wildcard src/*/*.h)
	@mkdir -p $(@D)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -o $@ $< $(FUZZ_SRC_$*) $(FUZZ_LIB_$*)
$(BUILD)/fuzz/tokenizer.json: tests/fixtures/tokenizer/qwen3/tokenizer.json.gz
	@mkdir -p $(@D)
	gzip -dc $< > $@

# The C flags of a build without CUDA (tests/suite_cpu_build.sh compiles with them)
cpu-cflags:
	@echo $(CFLAGS_BASE)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
