// Chat templates: turn a conversation into the prompt text a chat model was
// trained on, for the four template families zack knows. Instead of running a
// Jinja interpreter, chat_template_detect() recognizes the family from the
// template text stored in the GGUF key tokenizer.chat_template, and chat_apply()
// renders that family's official template byte for byte (tests/test_chat_template.py
// checks this against the jinja2 package on the real template texts).
//
// Conventions
// - BOS: the single BOS a template writes at the very start ("<|begin_of_text|>",
//   "<s>", "<bos>") is NOT part of chat_apply's output: the caller adds the BOS
//   token as the vocabulary's add_bos flag says. Anything else the template writes
//   is included as text, e.g. Llama 2's "<s>" before every later [INST] and its
//   "</s>" after every assistant turn; tokenize with parse_special on.
// - Prefix property: for every kind, rendering a conversation with
//   add_generation_prompt = false gives a prefix of rendering it extended by more
//   messages (with either flag). Multi-turn chat relies on this to feed only the
//   new suffix.
// - Errors: where the official template raises (Llama 2 and Gemma: roles must
//   alternate user/assistant after an optional leading system message), chat_apply
//   throws zk::error.
//
// Family by family (what the official templates do):
//   CHATML  "<|im_start|>" role "\n" content "<|im_end|>\n" per message; generation
//           prompt "<|im_start|>assistant\n". When the template inserts a default
//           system message for conversations that do not start with one (SmolLM2:
//           "You are a helpful AI assistant named SmolLM, trained by Hugging Face"),
//           it is rendered first; see chat_template_detect.
//   LLAMA3  "<|start_header_id|>" role "<|end_header_id|>\n\n" trim(content)
//           "<|eot_id|>"; generation prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
//           (Meta-Llama-3-*-Instruct; the Llama 3.1+ templates add a dated system
//           header and tool support, which this does not reproduce.)
//   LLAMA2  system goes inside the first [INST] as "<<SYS>>\n" system "\n<</SYS>>\n\n";
//           user: "<s>[INST] " strip(content) " [/INST]" (no "<s>" on the first one),
//           assistant: " " strip(content) " </s>". No separate generation prompt.
//   GEMMA   no system role: the system text + "\n\n" is prepended to the first
//           user turn (Gemma 3); "<start_of_turn>" role "\n" trim(content)
//           "<end_of_turn>\n" with "assistant" written as "model"; generation
//           prompt "<start_of_turn>model\n".
// trim/strip remove leading and trailing whitespace as Python's str.strip() does
// (ASCII and Unicode white space).
#pragma once
#include <string>
#include <vector>

namespace zk {

enum class chat_template_kind { CHATML, LLAMA3, LLAMA2, GEMMA };

struct chat_message {
    std::string role;  // system | user | assistant
    std::string content;
};

struct chat_template {
    chat_template_kind kind = chat_template_kind::CHATML;
    std::string default_system;  // system text the template inserts when none is given (CHATML only), may be empty
};

// Recognizes the family from the Jinja source by its markers: "<|im_start|>" ->
// CHATML, "<|start_header_id|>" -> LLAMA3, "[INST]" -> LLAMA2, "<start_of_turn>"
// -> GEMMA (checked in this order); empty or unrecognized text falls back to CHATML
// (as llama.cpp does).
// For CHATML the default system text is taken from the template when it has a
// branch `{% if ... messages[0]['role'] != 'system' %}` (also `messages[0].role`,
// double quotes) whose first string literal starts "<|im_start|>system\n": the text
// is what follows up to "<|im_end|>", across adjacent literals joined with '+'.
// Jinja escapes (\n, \t, \', \", \\) are decoded. If the branch builds the text
// from anything but literals, default_system stays empty.
chat_template chat_template_detect(const std::string& jinja_source);

// "chatml", "llama3", "llama2", "gemma" (no default system text); throws zk::error
// listing the valid names otherwise.
chat_template chat_template_from_name(const std::string& name);

const char* chat_template_name(chat_template_kind k);

// Renders msgs as the model's Jinja template would, BOS excluded (see above);
// add_generation_prompt appends the assistant header.
std::string chat_apply(const chat_template& t, const std::vector<chat_message>& msgs, bool add_generation_prompt);

}  // namespace zk
