# Sourced by shell tests: make_corpus FILE N writes N JSONL documents of varied English text,
# enough for windows of the small test config (T = 32).
make_corpus() {
	awk -v n="$2" 'BEGIN {
		split("the a one every some no this that", det, " ");
		split("fox dog river city model path expert token corpus garden", noun, " ");
		split("runs sees trains routes jumps reads writes keeps", verb, " ");
		for (d = 0; d < n; d++) {
			s = "";
			for (w = 0; w < 40 + (d * 7) % 50; w++) {
				i = (d * 31 + w * 17) % 8 + 1; j = (d * 7 + w * 13) % 10 + 1;
				k = (d + w * 5) % 8 + 1;
				s = s det[i] " " noun[j] " " verb[k] ((w % 6 == 5) ? ". " : " ");
			}
			printf "{\"text\": \"%s\", \"id\": %d}\n", s, d;
		}
	}' >"$1"
}
