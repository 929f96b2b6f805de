// llama.cpp's logits for teacher-forced sequences, for checks of fl against llama.cpp on the same
// GGUF file (issue 33). Built against a llama.cpp build (bench/llamacpp/build.sh).
//
//     dump_logits MODEL.gguf IN.txt OUT.bin [N_GPU_LAYERS]
//
// IN.txt: one sequence per line, "N id id id ...": the sequence's token ids (prompt, then the
// forced tokens) and N, the number of last positions whose logits to write. Each sequence is
// decoded alone from an empty cache, in one batch. OUT.bin: for every sequence in order, N rows
// of n_vocab little-endian f32 (the logits of positions len - N .. len - 1). Exit status 1 with
// a message naming the line on any failure.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "llama.h"

static int fail(const std::string &msg) {
    std::fprintf(stderr, "dump_logits: %s\n", msg.c_str());
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 4) return fail("usage: dump_logits MODEL.gguf IN.txt OUT.bin [N_GPU_LAYERS]");
    const int ngl = argc > 4 ? std::atoi(argv[4]) : 99;
    std::ifstream in(argv[2]);
    if (!in) return fail(std::string("cannot read ") + argv[2]);
    std::vector<std::pair<int, std::vector<llama_token>>> seqs;
    size_t longest = 0;
    for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        std::istringstream ls(line);
        int n = 0;
        ls >> n;
        std::vector<llama_token> ids;
        for (long long t; ls >> t;) ids.push_back((llama_token)t);
        if (n < 1 || (size_t)n > ids.size())
            return fail("line " + std::to_string(seqs.size() + 1) + ": N outside 1..length");
        longest = ids.size() > longest ? ids.size() : longest;
        seqs.emplace_back(n, std::move(ids));
    }
    if (seqs.empty()) return fail("no sequences");

    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = ngl;
    llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return fail(std::string("cannot load ") + argv[1]);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)longest;
    cp.n_batch = (uint32_t)longest;
    cp.n_ubatch = (uint32_t)longest;
    cp.n_seq_max = 1;
    llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) return fail("cannot create a context");
    FILE *out = std::fopen(argv[3], "wb");
    if (!out) return fail(std::string("cannot write ") + argv[3]);
    for (size_t s = 0; s < seqs.size(); ++s) {
        const int n_out = seqs[s].first;
        const std::vector<llama_token> &ids = seqs[s].second;
        const int n = (int)ids.size();
        for (llama_token t : ids)
            if (t < 0 || t >= n_vocab) return fail("line " + std::to_string(s + 1) + ": token id outside the vocabulary");
        llama_memory_clear(llama_get_memory(ctx), true);
        llama_batch b = llama_batch_init(n, 0, 1);
        for (int i = 0; i < n; ++i) {
            b.token[i] = ids[i];
            b.pos[i] = i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = i >= n - n_out;
        }
        b.n_tokens = n;
        if (llama_decode(ctx, b) != 0) return fail("line " + std::to_string(s + 1) + ": llama_decode failed");
        for (int i = n - n_out; i < n; ++i) {
            const float *l = llama_get_logits_ith(ctx, i);
            if (!l || std::fwrite(l, sizeof(float), (size_t)n_vocab, out) != (size_t)n_vocab)
                return fail("line " + std::to_string(s + 1) + ": no logits / write failed");
        }
        llama_batch_free(b);
    }
    std::fclose(out);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    std::fprintf(stderr, "dump_logits: %zu sequences, vocab %d\n", seqs.size(), n_vocab);
    return 0;
}
