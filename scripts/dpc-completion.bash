# dpc-completion.bash - bash completion for the project's programs (dpc-shard, dpc-train-path,
# dpc-outer, dpc-route, moe-bench, moe-profile).
#
#   . scripts/dpc-completion.bash            (or install it into
#                                             /usr/share/bash-completion/completions/)
#
# The words come from the programs themselves, at completion time: a program's (or its
# subcommand's) long options are those its --help lists, and its subcommands those under
# "commands:" in its --help (Tutel's flags as Tutel spells them: --capacity_factor), so
# completion never drifts from the option tables. After an option that takes a file, and for
# arguments, file names are offered.

_dpc_complete()
{
	local prog=${COMP_WORDS[0]} cur=${COMP_WORDS[COMP_CWORD]} sub="" help words
	# a program with subcommands: the first word after the program names one
	local cmds
	cmds=$("$prog" --help 2>/dev/null | sed -n '/^commands:/,/^$/p' | awk 'NR > 1 && NF { print $1 }')
	if [ -n "$cmds" ]; then
		if [ "$COMP_CWORD" -eq 1 ]; then
			COMPREPLY=($(compgen -W "$cmds --help --version" -- "$cur"))
			return
		fi
		sub=${COMP_WORDS[1]}
	fi
	if [[ $cur == -* ]]; then
		help=$("$prog" $sub --help 2>/dev/null)
		words=$(printf '%s\n' "$help" | grep -oE -- '--[a-z][a-z0-9_-]*' | sort -u)
		COMPREPLY=($(compgen -W "$words" -- "$cur"))
		return
	fi
	COMPREPLY=($(compgen -f -- "$cur"))
}

complete -o filenames -F _dpc_complete dpc-shard dpc-train-path dpc-outer dpc-route moe-bench \
	moe-profile
