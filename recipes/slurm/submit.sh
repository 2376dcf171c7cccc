#!/usr/bin/env bash
# Submit a shardsmith recipe to SLURM as four dependent jobs:
#   scatter:  an array job of TASKS tasks (rank = array index) reading the inputs, then
#   plan:     one task reading the part footers once, writing every split's plan, started only
#             when every scatter task succeeded (afterok), then
#   gather:   an array job of TASKS tasks, each writing its range of the shards, started only when
#             the plan succeeded, then
#   finalize: one task writing the manifest, started only when every gather task succeeded.
#
#   recipes/slurm/submit.sh RECIPE TASKS [extra sbatch args...]    e.g. --partition=cpu --account=ml
#
# Run it from the folder the recipe's relative paths start at (the jobs run there). The interpreter
# is $PYTHON (default python3), which must have shardsmith installed and be visible on every node.
# Prints the four job ids on stdout ("scatter=ID plan=ID gather=ID finalize=ID"), hints on stderr.
set -euo pipefail

usage() { echo "usage: $0 RECIPE TASKS [extra sbatch args...]" >&2; exit 2; }
[ $# -ge 2 ] || usage
RECIPE=$1 TASKS=$2
shift 2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

command -v sbatch >/dev/null || {
    echo "submit.sh: sbatch not found: run this on a SLURM login node (or 'make data RECIPE=$RECIPE' to run it here)" >&2
    exit 127
}
[ -f "$RECIPE" ] || { echo "submit.sh: $RECIPE: no such recipe" >&2; exit 2; }
case $TASKS in
    '' | *[!0-9]* | 0*) echo "submit.sh: TASKS must be a whole number >= 1, got '$TASKS'" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
# Check the recipe here, where a mistake costs nothing, rather than in TASKS queued jobs.
"$PYTHON" -m shardsmith run "$RECIPE" --dry-run >/dev/null || {
    echo "submit.sh: '$PYTHON -m shardsmith run $RECIPE --dry-run' failed (set PYTHON to an interpreter with shardsmith)" >&2
    exit 1
}
RECIPE=$(cd "$(dirname "$RECIPE")" && pwd)/$(basename "$RECIPE")
export RECIPE PYTHON SHARDSMITH_WORLD_SIZE=$TASKS
ALL="0-$((TASKS - 1))"

# sbatch does not create the folders of --output/--error (a job writing into a missing one fails
# without a log): make them, for the templates' #SBATCH lines and any given here.
for spec in $(sed -n 's/^#SBATCH *--\(output\|error\)[= ]\(.*\)$/\2/p' "$HERE"/{scatter,plan,gather,finalize}.sbatch) \
            $(printf '%s\n' "$@" | sed -n 's/^--\(output\|error\)=\(.*\)$/\2/p; s/^-[oe]\(..*\)$/\1/p'); do
    case $spec in */*) dir=${spec%/*}; case $dir in *%*) ;; *) mkdir -p "$dir" ;; esac ;; esac
done

cancel() {  # cancel STAGE JOB...: a later submission failed; the earlier jobs must not run alone
    echo "submit.sh: submitting $1 failed; cancelling job(s) ${*:2}" >&2
    scancel "${@:2}" 2>/dev/null || true
    exit 1
}
scatter=$(sbatch --parsable --export=ALL --array="$ALL" "$@" "$HERE/scatter.sbatch")
scatter=${scatter%%;*}  # "ID;cluster" on federated setups
plan=$(sbatch --parsable --export=ALL --dependency="afterok:$scatter" "$@" "$HERE/plan.sbatch") ||
    cancel plan "$scatter"
plan=${plan%%;*}
gather=$(sbatch --parsable --export=ALL --array="$ALL" --dependency="afterok:$plan" "$@" "$HERE/gather.sbatch") ||
    cancel gather "$scatter" "$plan"
gather=${gather%%;*}
finalize=$(sbatch --parsable --export=ALL --dependency="afterok:$gather" "$@" "$HERE/finalize.sbatch") ||
    cancel finalize "$scatter" "$plan" "$gather"
finalize=${finalize%%;*}
echo "scatter=$scatter plan=$plan gather=$gather finalize=$finalize"

again="$(printf 'PYTHON=%q RECIPE=%q SHARDSMITH_WORLD_SIZE=%q sbatch --export=ALL' "$PYTHON" "$RECIPE" "$TASKS")"
[ $# -eq 0 ] || again="$again$(printf ' %q' "$@")"
dir=$(printf '%q' "$HERE")
cat >&2 <<HINT
submit.sh: $RECIPE: scatter job $scatter (array $ALL), then plan job $plan, then gather job $gather (array $ALL), then finalize job $finalize.
  watch:  squeue -j $scatter,$plan,$gather,$finalize     (logs: the templates' --output, slurm-logs/ by default)
  a rank failed: the later jobs do not start (if they pend as DependencyNeverSatisfied, scancel them).
  Rerun only what failed (R: a rank, or a list like 1,5), then the later stages; paste in bash:
   scatter rank R:
    s=\$($again --parsable --array=R $dir/scatter.sbatch)
    p=\$($again --parsable --dependency=afterok:\$s $dir/plan.sbatch)
    g=\$($again --parsable --array=$ALL --dependency=afterok:\$p $dir/gather.sbatch)
    $again --dependency=afterok:\$g $dir/finalize.sbatch
   plan:
    p=\$($again --parsable $dir/plan.sbatch)
    g=\$($again --parsable --array=$ALL --dependency=afterok:\$p $dir/gather.sbatch)
    $again --dependency=afterok:\$g $dir/finalize.sbatch
   gather rank R:
    g=\$($again --parsable --array=R $dir/gather.sbatch)
    $again --dependency=afterok:\$g $dir/finalize.sbatch
   finalize:
    $again $dir/finalize.sbatch
HINT
