// spm_shim.cc - SentencePiece behind the C interface of spm_shim.h (built with HAVE_SPM).
// No exception leaves this file: every entry point catches and reports in err.
#include "io/spm_shim.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

// Exported by libsentencepiece (the Python module turns logging off with it) but not declared
// in its public headers.
namespace sentencepiece {
namespace logging {
void SetMinLogLevel(int v);
}
}

struct spm_model {
	sentencepiece::SentencePieceProcessor sp;
};

namespace {

/* what, and SentencePiece's reason without the place in its sources that its status text
 * starts with ("Internal: ./src/x.cc(660) [condition] reason"): the reason, if any. */
void say(char *err, size_t errn, const char *what, const std::string &why)
{
	std::string r = why;
	const size_t src = r.find("./"), close = r.find("] ");
	if (src != std::string::npos && close != std::string::npos && close > src) {
		r = r.substr(close + 2);
	} else if (src != std::string::npos) { /* "./third_party/x.h:1143: exception: why" */
		const size_t colon = r.find(": ", src);
		r = colon == std::string::npos ? std::string() : r.substr(colon + 2);
		if (r.rfind("exception: ", 0) == 0)
			r = r.substr(11);
	}
	while (!r.empty() && (r.back() == ' ' || r.back() == '\n'))
		r.pop_back();
	if (errn)
		std::snprintf(err, errn, "%s%s%s", what, r.empty() ? "" : ": ", r.c_str());
}

void quiet()
{
	static bool done = false;
	if (!done) {
		sentencepiece::logging::SetMinLogLevel(2); // errors still come back as Status
		done = true;
	}
}

// The caller's texts, one at a time, as the trainer's sentences.
class Texts : public sentencepiece::SentenceIterator {
public:
	Texts(int (*next)(void *, const char **, size_t *), void *ctx) : next_(next), ctx_(ctx)
	{
		Next();
	}
	bool done() const override { return done_; }
	void Next() override
	{
		const char *t = nullptr;
		size_t n = 0;
		int rc = next_(ctx_, &t, &n);
		if (rc == 1) {
			value_.assign(t, n);
		} else {
			done_ = true;
			if (rc < 0)
				status_ = sentencepiece::util::Status(
					sentencepiece::util::StatusCode::kCancelled,
					"reading the texts failed");
		}
	}
	const std::string &value() const override { return value_; }
	sentencepiece::util::Status status() const override { return status_; }

private:
	int (*next_)(void *, const char **, size_t *);
	void *ctx_;
	std::string value_;
	bool done_ = false;
	sentencepiece::util::Status status_;
};

} // namespace

extern "C" int spm_shim_load(struct spm_model **out, const void *bytes, size_t len, char *err,
			     size_t errn)
{
	*out = nullptr;
	try {
		quiet();
		/* owned until it loads: a throw from inside the library frees it too */
		auto m = std::make_unique<spm_model>();
		auto st = m->sp.LoadFromSerializedProto(
			std::string_view(static_cast<const char *>(bytes), len));
		if (!st.ok()) {
			say(err, errn, "not a SentencePiece model", st.ToString());
			return -1;
		}
		*out = m.release();
		return 0;
	} catch (const std::exception &e) {
		say(err, errn, "cannot load the SentencePiece model", e.what());
		return -1;
	}
}

extern "C" void spm_shim_free(struct spm_model *m)
{
	delete m;
}

extern "C" uint32_t spm_shim_vocab(const struct spm_model *m)
{
	return static_cast<uint32_t>(m->sp.GetPieceSize());
}

extern "C" const char *spm_shim_piece(const struct spm_model *m, uint32_t id)
{
	return m->sp.IdToPiece(static_cast<int>(id)).c_str();
}

extern "C" int spm_shim_kind(const struct spm_model *m, uint32_t id)
{
	const int i = static_cast<int>(id);
	if (m->sp.IsByte(i))
		return SPM_PIECE_BYTE;
	if (m->sp.IsControl(i) || m->sp.IsUnknown(i) || m->sp.IsUnused(i))
		return SPM_PIECE_CONTROL;
	return SPM_PIECE_TEXT;
}

extern "C" float spm_shim_score(const struct spm_model *m, uint32_t id)
{
	return m->sp.GetScore(static_cast<int>(id));
}

extern "C" int spm_shim_encode(const struct spm_model *m, const char *text, size_t len,
			       uint32_t **ids, uint64_t *n, uint64_t *cap, char *err, size_t errn)
{
	try {
		std::vector<int> v;
		auto st = m->sp.Encode(std::string_view(text, len), &v);
		if (!st.ok()) {
			say(err, errn, "SentencePiece cannot encode the text", st.ToString());
			return -1;
		}
		if (*n + v.size() > *cap) {
			uint64_t c = *cap ? *cap : 4096;
			while (c < *n + v.size())
				c *= 2;
			void *p = std::realloc(*ids, c * sizeof(uint32_t));
			if (!p) {
				say(err, errn, "out of memory", "for the tokens");
				return -1;
			}
			*ids = static_cast<uint32_t *>(p);
			*cap = c;
		}
		for (size_t i = 0; i < v.size(); i++)
			(*ids)[*n + i] = static_cast<uint32_t>(v[i]);
		*n += v.size();
		return 0;
	} catch (const std::exception &e) {
		say(err, errn, "SentencePiece cannot encode the text", e.what());
		return -1;
	}
}

extern "C" int spm_shim_decode(const struct spm_model *m, const uint32_t *ids, size_t n,
			       char **text, size_t *len, char *err, size_t errn)
{
	*text = nullptr;
	try {
		std::vector<int> v(ids, ids + n);
		std::string s;
		auto st = m->sp.Decode(v, &s);
		if (!st.ok()) {
			say(err, errn, "SentencePiece cannot decode the tokens", st.ToString());
			return -1;
		}
		char *p = static_cast<char *>(std::malloc(s.size() + 1));
		if (!p) {
			say(err, errn, "out of memory", "for the text");
			return -1;
		}
		std::memcpy(p, s.data(), s.size());
		p[s.size()] = 0;
		*text = p;
		*len = s.size();
		return 0;
	} catch (const std::exception &e) {
		say(err, errn, "SentencePiece cannot decode the tokens", e.what());
		return -1;
	}
}

extern "C" int spm_shim_train(const struct spm_train_args *a,
			      int (*next)(void *ctx, const char **text, size_t *len), void *ctx,
			      char **out, size_t *out_len, char *err, size_t errn)
{
	*out = nullptr;
	try {
		quiet();
		sentencepiece::SetRandomGeneratorSeed(a->seed);
		// Lossless on any UTF-8 text: no normalisation, spaces kept as they are, no dummy
		// prefix, and bytes for what the pieces do not cover (byte_fallback).
		std::unordered_map<std::string, std::string> kw = {
			{"model_type", a->type},
			{"vocab_size", std::to_string(a->vocab)},
			{"input_sentence_size", std::to_string(a->sample)},
			{"shuffle_input_sentence", "true"},
			{"num_threads", std::to_string(a->threads)},
			{"max_sentence_length", std::to_string(a->max_len)},
			{"character_coverage", std::to_string(a->character_coverage)},
			{"byte_fallback", "true"},
			{"normalization_rule_name", "identity"},
			{"remove_extra_whitespaces", "false"},
			{"add_dummy_prefix", "false"},
			{"split_digits", "false"},
		};
		Texts texts(next, ctx);
		std::string model;
		auto st = sentencepiece::SentencePieceTrainer::Train(kw, &texts, &model);
		if (!st.ok()) {
			say(err, errn, "SentencePiece training failed", st.ToString());
			return -1;
		}
		char *p = static_cast<char *>(std::malloc(model.size() ? model.size() : 1));
		if (!p) {
			say(err, errn, "out of memory", "for the model");
			return -1;
		}
		std::memcpy(p, model.data(), model.size());
		*out = p;
		*out_len = model.size();
		return 0;
	} catch (const std::exception &e) {
		say(err, errn, "SentencePiece training failed", e.what());
		return -1;
	}
}
