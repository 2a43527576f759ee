"""llama.cpp's spellings of llogos' options, and one line for each llama.cpp option llogos lacks.

People coming from llama.cpp type its flags, and Click would misread them: an undeclared `-ngl 99`
parses as `-n gl`, `-ctk q8_0` as `-c tk`, `-mu URL` as `-m u`. Every command is a LlamaCommand:
it takes llama.cpp's other names of the options it has (SPELLINGS), and it refuses an option of
llama.cpp's it does not have by name, before Click could read it as something else.
"""

import click

# llama.cpp's names (common/arg.cpp) of options llogos declares under its own name: a command that
# has the option on the left also takes the names on the right.
SPELLINGS = {
    "--temp": ("--temperature",),
    "--seed": ("-s",),
    "--n-predict": ("--predict",),
    "--cache-type-k": ("-ctk",),
    "--cache-type-v": ("-ctv",),
    "--json-schema-file": ("-jf",),
    "--special": ("-sp",),
    "--system": ("--system-prompt",),
    "--system-file": ("-sysf", "--system-prompt-file"),
    "--stop": ("-r", "--reverse-prompt"),
    "--chat": ("-cnv", "--conversation"),
    "--echo": ("--display-prompt",),
    "--no-echo": ("--no-display-prompt",),
    "--stats": ("--perf",),
    "--no-stats": ("--no-perf",),
    "--cache-ram": ("-cram",),
}

# Every option of llama.cpp's tools (common/arg.cpp, llama-bench's own, and --mlock/--no-mmap of
# the releases before --load-mode), aliases joined by "/". Left out: the sampler flags (--typical,
# --mirostat*, --dry-*, --xtc-*, --top-nsigma, --samplers, -l), speculative decoding's (-md, --draft*,
# --spec-*) and the web page's switch, which llogos declares where it implements them. A command
# that declares a name takes it, whatever this list says.
_LLAMA_CPP = """
-h/--help/--usage --version -cl/--cache-list --completion-bash --server-base --verbose-prompt --display-prompt
--no-display-prompt -co/--color -t/--threads -tb/--threads-batch -C/--cpu-mask -Cr/--cpu-range --cpu-strict
--prio --poll -Cb/--cpu-mask-batch -Crb/--cpu-range-batch --cpu-strict-batch --prio-batch --poll-batch
-lcs/--lookup-cache-static -lcd/--lookup-cache-dynamic -c/--ctx-size --kv-unified-per-slot
-n/--predict/--n-predict -b/--batch-size -ub/--ubatch-size --keep --swa-full
-ctxcp/--ctx-checkpoints/--swa-checkpoints -cms/--checkpoint-min-step -cram/--cache-ram -kvu/--kv-unified
-no-kvu/--no-kv-unified --cache-idle-slots --no-cache-idle-slots --context-shift --no-context-shift --chunks
-fa/--flash-attn -p/--prompt -sys/--system-prompt --perf --no-perf --show-timings --no-show-timings -f/--file
-sysf/--system-prompt-file --in-file -bf/--binary-file -e/--escape --no-escape -ptc/--print-token-count
--prompt-cache --prompt-cache-all --prompt-cache-ro -r/--reverse-prompt -sp/--special -cnv/--conversation
-no-cnv/--no-conversation -st/--single-turn -i/--interactive -if/--interactive-first -mli/--multiline-input
--in-prefix-bos --in-prefix --in-suffix --warmup --no-warmup --spm-infill -s/--seed --sampler-seq/--sampling-seq
--ignore-eos --temp/--temperature --top-k --top-p --min-p --repeat-last-n --repeat-penalty --presence-penalty
--frequency-penalty --adaptive-target --adaptive-decay --dynatemp-range --dynatemp-exp --grammar --grammar-file
-j/--json-schema -jf/--json-schema-file -bs/--backend-sampling --pooling --attention --rope-scaling --rope-scale
--rope-freq-base --rope-freq-scale --yarn-orig-ctx --yarn-ext-factor --yarn-attn-factor --yarn-beta-slow
--yarn-beta-fast -gan/--grp-attn-n -gaw/--grp-attn-w -kvo/--kv-offload -nkvo/--no-kv-offload --repack
-nr/--no-repack --no-host -ctk/--cache-type-k -ctv/--cache-type-v --hellaswag --hellaswag-tasks --winogrande
--winogrande-tasks --multiple-choice --multiple-choice-tasks --kl-divergence
--save-all-logits/--kl-divergence-base --ppl-stride --ppl-output-type -dt/--defrag-thold -np/--parallel
-ns/--sequences -cb/--cont-batching -nocb/--no-cont-batching -mm/--mmproj -mmu/--mmproj-url --mmproj-auto
--no-mmproj/--no-mmproj-auto --mmproj-offload --no-mmproj-offload --image/--audio/--video --image-min-tokens
--image-max-tokens --mtmd-batch-max-tokens --video-fps --video-timestamp-interval --video-ffmpeg-dir --rpc
-lm/--load-mode -lzm/--lazy-mode --numa -dev/--device --list-devices -ot/--override-tensor -cmoe/--cpu-moe
-ncmoe/--n-cpu-moe -ncffn/--n-cpu-ffn -ngl/--gpu-layers/--n-gpu-layers -sm/--split-mode -ts/--tensor-split
-mg/--main-gpu -fit/--fit -fitp/--fit-print -fitt/--fit-target -fitc/--fit-ctx --check-tensors --override-kv
--op-offload --no-op-offload --lora --lora-scaled --control-vector --control-vector-scaled
--control-vector-layer-range -a/--alias --tags -m/--model -mu/--model-url -dr/--docker-repo -hf/-hfr/--hf-repo
-hff/--hf-file -hft/--hf-token --mtp --dflash --eagle3 --context-file --chunk-size --chunk-separator --junk
--pos -o/--output/--output-file -ofreq/--output-frequency --output-format --save-frequency --process-output
--ppl --no-ppl --chunk/--from-chunk --show-statistics --parse-special --ids --stdin --no-bos --no-parse-special
--show-count -pps -tgs -npp -ntg -npl --embd-normalize --embd-output-format --embd-separator --cls-separator
--host --port --reuse-port --path --cors-origins --cors-methods --cors-headers --cors-credentials
--no-cors-credentials --api-prefix --tools --tools-runtime --mcp-servers-config --mcp-servers-json -ag/--agent
-no-ag/--no-agent --embedding/--embeddings --rerank/--reranking --api-key --api-key-file --ssl-key-file
--ssl-cert-file --chat-template-kwargs -to/--timeout --sse-ping-interval --threads-http --cache-prompt
--no-cache-prompt --cache-reuse --metrics --props --slots --no-slots --slot-save-path --media-path --models-dir
--models-preset --models-max --models-autoload --no-models-autoload --jinja --no-jinja --reasoning-format
-rea/--reasoning --reasoning-effort --reasoning-budget --reasoning-budget-message --reasoning-preserve
--no-reasoning-preserve --chat-template --chat-template-file --skip-chat-parsing --no-skip-chat-parsing
--prefill-assistant --no-prefill-assistant -sps/--slot-prompt-similarity --lora-init-without-apply
--sleep-idle-seconds --simple-io --positive-file --negative-file --pca-batch --pca-iter --method --log-disable
--log-file --log-jsonl --no-log-jsonl --log-prompts-dir --log-colors -v/--verbose/--log-verbose --offline
-lv/--verbosity/--log-verbosity --log-prefix --no-log-prefix --log-timestamps --no-log-timestamps --tts-lang
--tts-speaker-file --diffusion-steps --diffusion-visual --diffusion-eps --diffusion-algorithm
--diffusion-alg-temp --diffusion-block-length --diffusion-cfg-scale --diffusion-add-gumbel-noise
-lr/--learning-rate -lr-min/--learning-rate-min -decay-epochs/--learning-rate-decay-epochs -wd/--weight-decay
-val-split/--val-split -epochs/--epochs -opt/--optimizer --check --save-logits --logits-output-dir
--tensor-filter --embd-gemma-default --fim-qwen-1.5b-default --fim-qwen-3b-default --fim-qwen-7b-default
--fim-qwen-7b-spec --fim-qwen-14b-spec --fim-qwen-30b-default --gpt-oss-20b-default --gpt-oss-120b-default
--vision-gemma-4b-default --vision-gemma-12b-default --mlock --mmap --no-mmap -dio/--direct-io -pg -mmp -embd
-oe/--output-err -nopo --progress --delay
"""
LLAMA_CPP_OPTIONS = {name: group for group in _LLAMA_CPP.split() for name in group.split("/")}


class LlamaCommand(click.Command):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        declared = {name for p in self.params for name in _names(p)}
        for p in self.params:
            if isinstance(p, click.Option):
                p.opts += _spellings(p.opts, declared)
                p.secondary_opts += _spellings(p.secondary_opts, declared)

    def parse_args(self, ctx, args):
        name = foreign_option(self.get_params(ctx), args)
        if name is not None:
            raise click.UsageError(f"{LLAMA_CPP_OPTIONS[name]} is a llama.cpp option that llogos {ctx.info_name} "
                                   "does not have", ctx)
        return super().parse_args(ctx, args)


def foreign_option(params, args: list[str]) -> str | None:
    """The first of args that is a llama.cpp option none of params declares, reading args as Click
    will: a declared option's value is skipped, whatever it looks like, and `--` ends the options."""
    takes_value = {}
    for p in params:
        if isinstance(p, click.Option):
            takes_value |= {name: not p.is_flag and not p.count for name in p.opts}
            takes_value |= {name: False for name in p.secondary_opts}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return None
        name = arg.split("=", 1)[0]   # --opt=value, and -ngl=99 (Click reads a multi-letter -opt as a long one)
        if name in takes_value:
            i += 2 if takes_value[name] and name == arg else 1
            continue
        if name in LLAMA_CPP_OPTIONS:
            return name
        i += 1
    return None


def _names(param) -> list[str]:
    return param.opts + param.secondary_opts if isinstance(param, click.Option) else []


def _spellings(names: list[str], declared: set[str]) -> list[str]:
    return [s for name in names for s in SPELLINGS.get(name, ()) if s not in declared]
