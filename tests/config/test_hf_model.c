/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/config/test_hf_model.c: zinf_hf_model_read on the config.json files of published
 * models (their sizes as Hugging Face ships them), against parameter counts worked by hand from
 * the modules transformers builds, which equal the models' published sizes: Llama-2-7B
 * 6738415616, Llama-3-8B (grouped-query attention) 8030261248, GPT-2 124439808, Qwen2-0.5B
 * (q/k/v biases, tied head) 494032768; and the refusals, each naming the file and the key.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/config.h"

ZT_TMPDIR_SUITE(hf_model);

/* Write text as DIR/config.json and read it (through the directory, as --hf-config DIR). */
static int
read_text(const char *text, struct zinf_hf_model *m)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/config.json", dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
	memset(m, 0, sizeof(*m));
	m->size = sizeof(*m);
	return zinf_hf_model_read(dir, m);
}

Test(hf_model, llama_2_7b)
{
	struct zinf_hf_model m;
	int rc =
		read_text("{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\",\n"
			  " \"hidden_size\": 4096, \"intermediate_size\": 11008,\n"
			  " \"num_attention_heads\": 32, \"num_hidden_layers\": 32,\n"
			  " \"num_key_value_heads\": 32, \"vocab_size\": 32000,\n"
			  " \"rms_norm_eps\": 1e-05, \"tie_word_embeddings\": false}",
			  &m);
	cr_assert_eq(rc, 0, "%s", zinf_last_error());
	cr_expect_eq(m.arch, ZINF_HF_LLAMA);
	cr_expect_eq(m.head_dim, 128);
	/* per block: 4 x 4096^2 + 3 x 4096 x 11008 + 2 x 4096; embed and head 32000 x 4096 */
	cr_expect_eq(m.layer_params, 202383360ull);
	cr_expect_eq(m.params, 6738415616ull);
	cr_expect_eq(m.largest_layer, 202383360ull);
}

Test(hf_model, llama_3_8b_grouped_query_attention)
{
	struct zinf_hf_model m;
	int rc = read_text("{\"model_type\": \"llama\", \"hidden_size\": 4096,\n"
			   " \"intermediate_size\": 14336, \"num_attention_heads\": 32,\n"
			   " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8,\n"
			   " \"vocab_size\": 128256, \"rope_theta\": 500000.0}",
			   &m);
	cr_assert_eq(rc, 0, "%s", zinf_last_error());
	cr_expect_eq(m.kv_heads, 8);
	/* k and v: 4096 x 1024 each */
	cr_expect_eq(m.layer_params, 218112000ull);
	cr_expect_eq(m.params, 8030261248ull);
	cr_expect_eq(m.largest_layer, 525336576ull, "the embedding, 128256 x 4096");
	cr_expect_not(m.tied);
}

Test(hf_model, gpt2_small)
{
	struct zinf_hf_model m;
	int rc = read_text("{\"model_type\": \"gpt2\", \"n_embd\": 768, \"n_head\": 12,\n"
			   " \"n_inner\": null, \"n_layer\": 12, \"n_positions\": 1024,\n"
			   " \"vocab_size\": 50257}",
			   &m);
	cr_assert_eq(rc, 0, "%s", zinf_last_error());
	cr_expect_eq(m.arch, ZINF_HF_GPT2);
	cr_expect_eq(m.intermediate, 3072);
	cr_expect(m.tied);
	cr_expect_eq(m.layer_params, 7087872ull);
	cr_expect_eq(m.params, 124439808ull);
	cr_expect_eq(m.largest_layer, 38597376ull, "wte, 50257 x 768");
}

Test(hf_model, qwen2_biases_and_tied_head)
{
	struct zinf_hf_model m;
	int rc = read_text("{\"model_type\": \"qwen2\", \"hidden_size\": 896,\n"
			   " \"intermediate_size\": 4864, \"num_attention_heads\": 14,\n"
			   " \"num_hidden_layers\": 24, \"num_key_value_heads\": 2,\n"
			   " \"vocab_size\": 151936, \"tie_word_embeddings\": true}",
			   &m);
	cr_assert_eq(rc, 0, "%s", zinf_last_error());
	cr_expect(m.attention_bias && m.tied);
	cr_expect_eq(m.layer_params, 14912384ull);
	cr_expect_eq(m.params, 494032768ull);
}

Test(hf_model, refusals_name_the_file_and_key)
{
	struct zinf_hf_model m;
	cr_expect_eq(read_text("{\"model_type\": \"bert\", \"hidden_size\": 768}", &m), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "config.json: model_type bert: zinf knows gpt2, llama"),
		  "%s", zinf_last_error());
	cr_expect_eq(read_text("{\"model_type\": \"llama\", \"vocab_size\": 100}", &m), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "config.json: hidden_size: missing"), "%s",
		  zinf_last_error());
	cr_expect_eq(read_text("{\"model_type\": \"llama\", \"hidden_size\": 64,\n"
			       " \"intermediate_size\": 128, \"num_attention_heads\": 4,\n"
			       " \"num_hidden_layers\": 2, \"num_key_value_heads\": 3,\n"
			       " \"vocab_size\": 100}",
			       &m),
		     -EINVAL);
	cr_expect(strstr(zinf_last_error(), "the key/value heads (3) must divide them"), "%s",
		  zinf_last_error());
	cr_expect_eq(read_text("{\"model_type\": \"gpt2\", \"n_embd\": 1e3}", &m), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "config.json: vocab_size: missing"), "%s",
		  zinf_last_error());
	cr_expect_eq(
		read_text("{\"model_type\": \"gpt2\", \"vocab_size\": 10, \"n_embd\": 7.5}", &m),
		-EINVAL);
	cr_expect(strstr(zinf_last_error(), "n_embd: expected an integer in [1, 1048576]"), "%s",
		  zinf_last_error());
	cr_expect_eq(read_text("{\"model_type\": ", &m), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "config.json:1:"), "%s", zinf_last_error());
	memset(&m, 0, sizeof(m));
	m.size = sizeof(m);
	char missing[4300];
	snprintf(missing, sizeof(missing), "%s/none.json", dir);
	cr_expect_eq(zinf_hf_model_read(missing, &m), -ENOENT);
}

/* The settings a trainer needs: transformers' defaults when absent (LlamaConfig: rope_theta
 * 10000, rms_norm_eps 1e-6, hidden_act silu, 2048 positions; GPT2Config: layer_norm_epsilon 1e-5,
 * activation_function gelu_new, tied head), the file's values when given, mistral's window (4096
 * when absent) and qwen2's only with use_sliding_window, rope_scaling seen unless its type is
 * "default", GPT-2's attention variants and untied head. */
Test(hf_model, training_settings_and_their_defaults)
{
	static const char llama[] = "\"hidden_size\": 64, \"intermediate_size\": 128,\n"
				    " \"num_attention_heads\": 4, \"num_hidden_layers\": 2,\n"
				    " \"vocab_size\": 100";
	char text[1024];
	struct zinf_hf_model m;
	snprintf(text, sizeof(text), "{\"model_type\": \"llama\", %s}", llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect_eq(m.rope_theta, 10000.0);
	cr_expect_eq(m.norm_eps, 1e-6);
	cr_expect_str_eq(m.act, "silu");
	cr_expect_eq(m.max_positions, 2048);
	cr_expect_eq(m.sliding_window, 0);
	cr_expect(!m.rope_scaling);
	snprintf(text, sizeof(text),
		 "{\"model_type\": \"mistral\", %s, \"rope_theta\": 1e6, \"rms_norm_eps\": 1e-5,\n"
		 " \"hidden_act\": \"gelu\", \"max_position_embeddings\": 32768,\n"
		 " \"sliding_window\": 4096, \"rope_scaling\": {\"type\": \"linear\"}}",
		 llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect_eq(m.rope_theta, 1e6);
	cr_expect_eq(m.norm_eps, 1e-5);
	cr_expect_str_eq(m.act, "gelu");
	cr_expect_eq(m.max_positions, 32768);
	cr_expect_eq(m.sliding_window, 4096);
	cr_expect(m.rope_scaling);
	/* qwen2 ships a sliding_window it does not use */
	snprintf(text, sizeof(text), "{\"model_type\": \"qwen2\", %s, \"sliding_window\": 4096}",
		 llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect_eq(m.sliding_window, 0);
	snprintf(text, sizeof(text),
		 "{\"model_type\": \"qwen2\", %s, \"sliding_window\": 4096,\n"
		 " \"use_sliding_window\": true}",
		 llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect_eq(m.sliding_window, 4096);
	cr_assert_eq(read_text("{\"model_type\": \"gpt2\", \"n_embd\": 8, \"n_head\": 2,\n"
			       " \"n_layer\": 1, \"n_positions\": 16, \"vocab_size\": 10}",
			       &m),
		     0, "%s", zinf_last_error());
	cr_expect_eq(m.norm_eps, 1e-5);
	cr_expect_str_eq(m.act, "gelu_new");
	cr_expect_eq(m.max_positions, 16);
	cr_expect_eq(m.rope_theta, 0.0);
	cr_expect(m.tied, "GPT2Config's tie_word_embeddings defaults to true");
	cr_expect(!m.attn_unscaled && !m.attn_layer_scaled);
	uint64_t tied_params = m.params;
	/* an untied GPT-2 counts its lm_head (10 x 8); the attention variants are seen */
	cr_assert_eq(read_text("{\"model_type\": \"gpt2\", \"n_embd\": 8, \"n_head\": 2,\n"
			       " \"n_layer\": 1, \"n_positions\": 16, \"vocab_size\": 10,\n"
			       " \"tie_word_embeddings\": false, \"scale_attn_weights\": false,\n"
			       " \"scale_attn_by_inverse_layer_idx\": true}",
			       &m),
		     0, "%s", zinf_last_error());
	cr_expect(!m.tied);
	cr_expect_eq(m.params, tied_params + 80);
	cr_expect(m.attn_unscaled && m.attn_layer_scaled);
	/* mistral without sliding_window: MistralConfig's 4096; null: none */
	snprintf(text, sizeof(text), "{\"model_type\": \"mistral\", %s}", llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect_eq(m.sliding_window, 4096);
	snprintf(text, sizeof(text), "{\"model_type\": \"mistral\", %s, \"sliding_window\": null}",
		 llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect_eq(m.sliding_window, 0);
	/* a rope_scaling whose type is "default" scales nothing */
	snprintf(text, sizeof(text),
		 "{\"model_type\": \"llama\", %s, \"rope_scaling\": {\"rope_type\": \"default\"}}",
		 llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect(!m.rope_scaling);
	/* transformers 5's form: rope_parameters; a rope_type other than default is a scaling */
	snprintf(text, sizeof(text),
		 "{\"model_type\": \"llama\", %s, \"rope_parameters\": {\"rope_theta\": 500000.0,\n"
		 " \"rope_type\": \"default\"}}",
		 llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect_eq(m.rope_theta, 500000.0);
	cr_expect(!m.rope_scaling);
	snprintf(text, sizeof(text),
		 "{\"model_type\": \"llama\", %s, \"rope_parameters\": {\"rope_theta\": 500000.0,\n"
		 " \"rope_type\": \"llama3\", \"factor\": 8.0}}",
		 llama);
	cr_assert_eq(read_text(text, &m), 0, "%s", zinf_last_error());
	cr_expect(m.rope_scaling);
	snprintf(text, sizeof(text),
		 "{\"model_type\": \"llama\", %s, \"rope_parameters\": {\"rope_theta\": 0}}",
		 llama);
	cr_expect_eq(read_text(text, &m), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "rope_parameters.rope_theta: expected a number > 0"),
		  "%s", zinf_last_error());
	snprintf(text, sizeof(text), "{\"model_type\": \"llama\", %s, \"rope_theta\": -1}", llama);
	cr_expect_eq(read_text(text, &m), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "config.json: rope_theta: expected a number > 0"), "%s",
		  zinf_last_error());
	snprintf(text, sizeof(text), "{\"model_type\": \"llama\", %s, \"hidden_act\": 3}", llama);
	cr_expect_eq(read_text(text, &m), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "config.json: hidden_act: expected a string"), "%s",
		  zinf_last_error());
}
