//! Chat templates: the SmolLM2 GGUF's own template, a Qwen3-style template with tools and
//! namespaces, and the ChatML fallback for files without a template.


use gguf::chat_template::{ChatMessage, ChatTemplate, CHATML_TEMPLATE};
use gguf::TemplateError;
use gguf::reader::GgufFile;
use test_support::{model_path, GgufBuilder, Val};

const SMOL_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

#[test]
fn smollm2_template_adds_default_system_prompt() {
    let path = model_path();
    let g = GgufFile::open(&path).expect("opens");
    let t = ChatTemplate::from_gguf(&g).expect("template compiles");
    assert!(!t.is_fallback());
    assert_eq!(t.bos_token(), "<|im_start|>");
    assert_eq!(t.eos_token(), "<|im_end|>");

    let out = t
        .render(&[ChatMessage::new("user", "Hi")], true)
        .expect("renders");
    assert_eq!(
        out,
        format!("{SMOL_SYSTEM}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    );

    let msgs = [
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", "Tap OK"),
        ChatMessage::new("assistant", "{\"action_type\": \"click\", \"index\": 3}"),
    ];
    let out = t.render(&msgs, false).expect("renders");
    assert_eq!(
        out,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTap OK<|im_end|>\n<|im_start|>assistant\n{\"action_type\": \"click\", \"index\": 3}<|im_end|>\n"
    );
}

/// A Qwen3-style template written for this test: tools block with `tojson`, a `namespace`
/// updated inside a loop, `</think>` stripping with Python string methods, `raise_exception`
/// on unknown roles and an `enable_thinking` switch.
const QWEN_STYLE: &str = r##"
{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" + (tool | tojson) }}
    {%- endfor %}
    {{- "\n</tools><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_user=-1) %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- set ns.last_user = loop.index0 %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}{{- raise_exception('system message must come first') }}{%- endif %}
    {%- elif message.role == 'user' %}
        {{- '<|im_start|>user\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content %}
        {%- if '</think>' in content and loop.index0 < ns.last_user %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>assistant\n' + content.strip() + '<|im_end|>\n' }}
    {%- else %}
        {{- raise_exception('Unexpected message role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"##;

#[test]
fn qwen_style_template_with_tools_namespace_and_string_methods() {
    let t = ChatTemplate::new(QWEN_STYLE, "", "<|im_end|>").expect("compiles");
    let msgs = [
        ChatMessage::new("system", "You drive a phone."),
        ChatMessage::new("user", "Open settings"),
        ChatMessage::new(
            "assistant",
            "<think>\nfind the icon\n</think>\n\n  tapped  ",
        ),
        ChatMessage::new("user", "Now go back"),
    ];
    let extra = minijinja::context! {
        tools => vec![serde_json::json!({"name": "click"})],
        enable_thinking => false,
    };
    let out = t.render_with(&msgs, true, extra).expect("renders");
    let expected = concat!(
        "<|im_start|>system\nYou drive a phone.\n\n# Tools\n<tools>\n{\"name\":\"click\"}\n</tools><|im_end|>\n",
        "<|im_start|>user\nOpen settings<|im_end|>\n",
        "<|im_start|>assistant\ntapped<|im_end|>\n",
        "<|im_start|>user\nNow go back<|im_end|>\n",
        "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    );
    assert_eq!(out, expected);

    // Without tools or the thinking switch: plain system turn, no empty think block.
    let out = t.render(&msgs[..2], true).expect("renders");
    assert_eq!(
        out,
        "<|im_start|>system\nYou drive a phone.<|im_end|>\n<|im_start|>user\nOpen settings<|im_end|>\n<|im_start|>assistant\n"
    );

    // raise_exception reaches the caller with its message.
    let err = t
        .render(&[ChatMessage::new("robot", "beep")], false)
        .expect_err("unknown role");
    assert!(matches!(err, TemplateError::Render(_)));
    assert!(
        format!("{err:#?}").contains("Unexpected message role: robot"),
        "{err:#?}"
    );
}

#[test]
fn file_without_template_falls_back_to_chatml() {
    let b = GgufBuilder::default()
        .kv("general.architecture", Val::Str("llama".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Val::StrArr(vec!["<s>".into(), "</s>".into(), "a".into()]),
        )
        .kv("tokenizer.ggml.bos_token_id", Val::U32(0))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(1));
    let f = b.write_temp();
    let g = GgufFile::open(f.path()).expect("opens");
    let t = ChatTemplate::from_gguf(&g).expect("fallback");
    assert!(t.is_fallback());
    assert_eq!(t.source(), CHATML_TEMPLATE);
    assert_eq!((t.bos_token(), t.eos_token()), ("<s>", "</s>"));
    assert_eq!(
        t.render(&[ChatMessage::new("user", "x")], true)
            .expect("renders"),
        "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn broken_template_in_file_is_a_compile_error() {
    let b = GgufBuilder::default().kv("tokenizer.chat_template", Val::Str("{% if %}".into()));
    let f = b.write_temp();
    let g = GgufFile::open(f.path()).expect("opens");
    assert!(matches!(
        ChatTemplate::from_gguf(&g),
        Err(TemplateError::Compile(_))
    ));
}
