# laststand: one binary, build/laststand. CPU build always; CUDA sources are
# compiled and linked when nvcc is found (NO_CUDA=1 forces a CPU-only build).
# Objects go to build/. See README.md for `make run` and `make test`.

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
BUILD   ?= build
OPT     ?= -O3
CFLAGS  += -std=c11 -D_GNU_SOURCE $(OPT) -g -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare \
           -Wno-missing-field-initializers -fno-strict-aliasing -march=x86-64-v2 -mtune=native -pthread \
           -Iinclude -Isrc
LDLIBS  += -ljansson -lpcre2-8 -l:libutf8proc.a -lmicrohttpd -lcurl -lpthread -lm -ldl
LDFLAGS += -pthread -Wl,-rpath,'$$ORIGIN'

# Every module's sources (dependency order: base fmt tok ops model doctor engine server cli).
MODULES := base fmt tok grammar ops ops/cpu model doctor engine server
LIB_SRC := $(foreach m,$(MODULES),$(wildcard src/$(m)/*.c))
CLI_SRC := $(wildcard src/cli/*.c)
LIB_OBJ := $(LIB_SRC:src/%.c=$(BUILD)/obj/%.o)
CLI_OBJ := $(CLI_SRC:src/%.c=$(BUILD)/obj/%.o)

ifeq ($(NO_CUDA),1)
NVCC :=
endif
ifneq ($(NVCC),)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
CU_SRC  := $(wildcard src/ops/cuda/*.cu src/doctor/*.cu)
CU_OBJ  := $(CU_SRC:src/%.cu=$(BUILD)/obj/%.o)
NVARCH  ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_90,code=sm_90 \
           -gencode arch=compute_90,code=compute_90
NVFLAGS ?= -O3 -std=c++17 -lineinfo -Xcompiler -fPIC -Iinclude -Isrc $(NVARCH)
CFLAGS  += -DLS_HAVE_CUDA=1 -I$(CUDA_HOME)/include
LDLIBS  += -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib64/stubs -lcudart_static -lrt -lstdc++
LDFLAGS += -Wl,-rpath,$(CUDA_HOME)/lib64
endif

# Shared libraries the GPU machine lacks travel next to the binary (rpath $ORIGIN).
SHIP_SO := $(BUILD)/libmicrohttpd.so.12 $(BUILD)/libcmocka.so.0

BIN := $(BUILD)/laststand
LIB := $(BUILD)/liblaststand.a

UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(BUILD)/%)
# Fuzz drivers link the sources they exercise directly, built with ASan+UBSan.
FUZZ_DEPS := src/fmt/safetensors.c src/base/base.c src/base/pool.c
FUZZ_FLAGS := -std=c11 -D_DEFAULT_SOURCE -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
              -fno-omit-frame-pointer -Iinclude -Isrc

.PHONY: all setup run test unit e2e clean cuda-check demo
all: $(BIN) $(UNIT_BIN) $(SHIP_SO) $(FUZZ_BIN)

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: src/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c $< -o $@

# The test-only backend cuda_broken_sm100 is built for Blackwell only, on purpose. `override`:
# an NVARCH on make's command line (bench/int/prep_round.sh's sm_90a builds) must not reach
# these three objects, or the broken backend gets a Hopper image and runs.
$(BUILD)/obj/ops/cuda/fp4_gemm_sm100.o: override NVARCH := -gencode arch=compute_100a,code=sm_100a
# cuda_grouped_gemm's wgmma GEMMs (moe_wgmma.cu) exist on sm_90a only.
$(BUILD)/obj/ops/cuda/moe_wgmma.o: override NVARCH := -gencode arch=compute_90a,code=sm_90a
# cuda_flash_prefill's head_dim 256 wgmma prefill kernel (attention_prefill_wg.cu): sm_90a only.
$(BUILD)/obj/ops/cuda/attention_prefill_wg.o: override NVARCH := -gencode arch=compute_90a,code=sm_90a

$(LIB): $(LIB_OBJ) $(CU_OBJ)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN): $(CLI_OBJ) $(LIB)
	$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -o $@ $< $(LIB) $(LDFLAGS) $(LDLIBS) -lcmocka

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_DEPS) src/fmt/safetensors.h src/base/base.h
	@mkdir -p $(dir $@)
	$(CC) $(FUZZ_FLAGS) -o $@ $< $(FUZZ_DEPS) -ljansson -lpthread -lm

$(BUILD)/libmicrohttpd.so.12:
	@mkdir -p $(BUILD) && cp -L $$(ls /usr/lib/*/libmicrohttpd.so.12 | head -1) $@
$(BUILD)/libcmocka.so.0:
	@mkdir -p $(BUILD) && cp -L $$(ls /usr/lib/*/libcmocka.so.0 | head -1) $@

# ---- set-up, demo, tests ------------------------------------------------------
setup:
	@bash scripts/setup.sh

DEMO := $(BUILD)/demo-model
demo: $(BIN)
	@test -f $(DEMO)/config.json || ./$(BIN) synth --preset demo --out $(DEMO)

run: setup
	@$(MAKE) --no-print-directory -j$$(nproc) all
	@$(MAKE) --no-print-directory demo
	@bash scripts/run.sh $(BIN) $(DEMO)

unit: $(UNIT_BIN) $(FUZZ_BIN) $(SHIP_SO)
	@bash scripts/run_tests.sh unit

e2e: $(BIN) $(SHIP_SO)
	@bash scripts/run_tests.sh e2e

test: setup
	@$(MAKE) --no-print-directory -j$$(nproc) all
	@bash scripts/setup.sh --test
	@bash scripts/run_tests.sh

clean:
	rm -rf $(BUILD)

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(CU_OBJ:.o=.d) $(UNIT_BIN:=.d)
