# Thin wrappers; the logic lives in checks/, trainer/ and playbooks/.
PYTHON    ?= python3
# A node the pytorch role provisioned has its venv (the role's pytorch_venv): `make verify` and
# `make torch-build` of that node run from it as it is, unless VENV is given.
PROVISIONED_VENV ?= $(shell sed -n 's/^pytorch_venv: *//p' playbooks/roles/pytorch/defaults/main.yml)
ifeq ($(origin VENV)$(INVENTORY)$(filter-out verify torch-build,$(MAKECMDGOALS)),undefined)
ifneq ($(and $(MAKECMDGOALS),$(wildcard $(PROVISIONED_VENV)/bin/python)),)
VENV := $(PROVISIONED_VENV)
endif
endif
VENV      ?= .venv
INVENTORY ?=
LEVEL     ?= standard
ARGS      ?=
# pytest workers of `make test` (0: in one process)
TEST_JOBS ?= 2
# `make test` pins the torch the nodes get (the pytorch role's pytorch_torch_version, written
# once there); its build is this host's (torch-venv below): here the CPU build, from local disk.
# A VENV other than .venv (the provisioned one included) is used as it is: nothing is installed.
TORCH_VERSION := $(shell sed -n 's/^pytorch_torch_version: *"\(.*\)"/\1/p' playbooks/roles/pytorch/defaults/main.yml)
TORCH_PIN ?= torch==$(TORCH_VERSION)

ifeq ($(VENV),.venv)
RUN_DEPS := $(VENV)/.stamp-run
DEV_DEPS := $(VENV)/.stamp-dev
endif

.PHONY: venv verify test system-deps lint provision inventory-exists bench clean gpu-proof \
	torch-build torch-venv

$(VENV)/.stamp-run: pyproject.toml | torch-venv
	"$$PYTHON" -m venv "$$VENV" && "$$VENV/bin/python" -m pip install -q "$$TORCH_PIN" -e .
	touch $@

$(VENV)/.stamp-dev: $(VENV)/.stamp-run
	"$$VENV/bin/python" -m pip install -q "$$TORCH_PIN" -e '.[dev]'
	touch $@

venv: $(RUN_DEPS) $(DEV_DEPS)

# The torch build this host runs (checks/devtools/torchbuild.py: the pytorch role's choice from
# the loaded driver and the GPUs, the CPU build without a driver), one line saying which and why;
# `make torch-build` installs nothing.
torch-build:
	@"$$PYTHON" -m checks.devtools.torchbuild --pin "$$TORCH_PIN" $(if $(RUN_DEPS),--venv,--use-venv) "$$VENV"

# That build goes into the venv before anything else (the pins below name the release only, so
# pip keeps it), and again when the choice changes (a driver installed since): it runs on every
# use of .venv and installs only when the venv lacks the build.
torch-venv:
	@"$$PYTHON" -m checks.devtools.torchbuild --pin "$$TORCH_PIN" --venv "$$VENV" --install

# The user's values reach the recipes as environment variables, never pasted into the shell
# command: `LEVEL='quick;touch /tmp/p'` is a bad level (exit 2), not a second command. ARGS is
# split into words (globbing off) and nothing in it is run. The venv the recipes run from is
# named as "$$VENV" too: a crafted VENV is a missing interpreter, not a command.
export INVENTORY LEVEL ARGS CHECK VENV TEST_JOBS PYTHON TORCH_PIN

ifeq ($(INVENTORY),)
verify: $(RUN_DEPS)
	set -f; exec "$$VENV/bin/python" -m checks --level "$$LEVEL" $$ARGS
else
# A missing, unparsable or empty inventory (or a host name that is not one node name) is a usage
# error: ansible-playbook would skip every play and pass.
verify: inventory-exists $(DEV_DEPS)
	@case "$$LEVEL" in quick|standard|burn-in) ;; \
	  *) echo "error: LEVEL must be quick, standard or burn-in (got '$$LEVEL')" >&2; exit 2;; esac
	@"$$VENV/bin/python" -m checks.fleet.ansible_inventory "$$INVENTORY" gpu_nodes
	set -f; exec "$$VENV/bin/ansible-playbook" -i "$$INVENTORY" playbooks/verify.yml \
	  -e "verify_level=$$LEVEL" $$ARGS
endif

# System packages the tests need (debootstrap, gpg, ...): installed when root or passwordless
# sudo allows it, else one line with the command to run.
system-deps:
	@bash .ci/system-deps.sh

# Two workers (the machine has 2 cores); each test file stays on one worker, so its module
# fixtures are built once, and the files go out longest first (tests/durations.json, kept in
# that order by --no-loadscope-reorder; tests/conftest.py). TEST_JOBS=0 runs in-process. ARGS is
# split as a shell splits words (`ARGS="-m 'not e2e'"`), by .ci/with_args.py: nothing in it runs.
test: system-deps $(DEV_DEPS)
	exec "$$VENV/bin/python" .ci/with_args.py "$$VENV/bin/python" -m pytest \
	  $(if $(filter 0,$(TEST_JOBS)),,-n "$$TEST_JOBS" --dist loadfile --no-loadscope-reorder)

# ruff (style, imports, complexity over 15: pyproject.toml), mypy over the product, ansible-lint
lint: $(DEV_DEPS)
	"$$VENV/bin/ruff" check checks trainer tests benchmarks
	"$$VENV/bin/mypy" checks trainer
	venv=$$(cd "$$VENV" && pwd) && cd playbooks && "$$venv/bin/ansible-lint" --profile production

# Never falls back to the implicit localhost: no inventory file is a usage error. A named file
# that is not there is most likely a typo: the nearest names in its directory are suggested.
inventory-exists:
	@inv="$${INVENTORY:-inventory}"; test -f "$$inv" && exit 0; \
	if [ -z "$$INVENTORY" ]; then echo "error: no inventory file 'inventory'; copy inventory.example to inventory, list your GPU hosts, then run: make provision INVENTORY=inventory" >&2; exit 2; fi; \
	near=$$("$$PYTHON" .ci/near_files.py "$$inv" 2>/dev/null); \
	echo "error: inventory file '$$inv' does not exist$${near:+ (did you mean $$near?)}; to start one, copy inventory.example" >&2; exit 2

provision: inventory-exists $(DEV_DEPS)
	set -f; exec "$$VENV/bin/ansible-playbook" -i "$${INVENTORY:-inventory}" playbooks/provision.yml \
	  $${CHECK:+--check --diff} $$ARGS

# Every GPU path of this node once, into one bundle (docs/gpu-proof.md); exit 2 without NVIDIA GPUs.
gpu-proof: $(RUN_DEPS)
	set -f; exec "$$VENV/bin/python" -m checks.node.gpu_proof $$ARGS

bench: $(DEV_DEPS)
	for b in benchmarks/*.py; do "$$VENV/bin/python" "$$b" || exit 1; done

clean:
	rm -rf -- "$$VENV" reports .cache
