//! Chat templates rendered as transformers renders them: one template in each common
//! family's shape (written for these tests), checked against the exact text Jinja2 gives with
//! transformers' environment (trim_blocks, lstrip_blocks, raise_exception, tojson,
//! strftime_now), and the ways a model directory ships its template.
//!
//! Dict keys here are written in sorted order: serde_json and minijinja sort them unless
//! their `preserve_order` features are on, while Python keeps insertion order.
#![cfg(feature = "serve")]

/// ChatML with a default system prompt (the Qwen family's shape).
const CHATML: &str = r#"{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content'] %}
    {%- set rest = messages[1:] %}
{%- else %}
    {%- set system = 'You are a concise assistant.' %}
    {%- set rest = messages %}
{%- endif %}
{{- '<|im_start|>system\n' + system + '<|im_end|>\n' }}
{%- for message in rest %}
    {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

/// Header blocks after a BOS (the Llama-3 shape).
const HEADERS: &str = r#"{{- bos_token }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + message.content | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"#;

/// [INST] turns with a folded system prompt (the Llama-2 / Mistral shape), written without
/// `-` markers so that trim_blocks and lstrip_blocks alone shape the whitespace.
const INST: &str = r#"{% if messages[0]['role'] == 'system' %}
    {% set system_message = messages[0]['content'] | trim %}
    {% set loop_messages = messages[1:] %}
{% else %}
    {% set system_message = '' %}
    {% set loop_messages = messages %}
{% endif %}
{{ bos_token }}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}
        {% if loop.index0 == 0 and system_message %}
[INST] <<SYS>>
{{ system_message }}
<</SYS>>

{{ message['content'] | trim }} [/INST]
        {% else %}
[INST] {{ message['content'] | trim }} [/INST]
        {% endif %}
    {% elif message['role'] == 'assistant' %}
 {{ message['content'] | trim }}{{ eos_token }}
    {% endif %}
{% endfor %}
"#;

/// Python string and dict methods (minijinja-contrib's pycompat) and Python-style printing.
const PYMETHODS: &str = r#"{%- for message in messages %}
    {%- set content = message['content'].strip() %}
    {%- if content.startswith('/') %}
        {{- '<cmd>' + content[1:].split(' ')[0] + '</cmd>' + content.split(' ', 1)[1].title() + '\n' }}
    {%- elif content.endswith('?') %}
        {{- message['role'].upper() + ' asks: ' + content.replace('\n', ' ').lstrip('¿') + '\n' }}
    {%- else %}
        {{- message['role'] + ': ' + content + '\n' }}
    {%- endif %}
{%- endfor %}
{%- for key, value in meta.items() %}{{ key }}={{ value }};{% endfor %}
{{- '\n' + meta.get('missing', 'fallback') }}
"#;

/// Tools and tool calls serialised with tojson (the Hermes / Qwen tool-call shape).
const TOOLS: &str = r#"{%- if tools %}
    {{- '<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.tool_calls is defined and message.tool_calls %}
        {%- for call in message.tool_calls %}
            {{- '<call>' + call.function | tojson + '</call>\n' }}
        {%- endfor %}
    {%- else %}
        {{- message.role + ': ' + message.content + '\n' }}
    {%- endif %}
{%- endfor %}
{{- messages[-1] | tojson(indent=2) }}
"#;

/// A dated system line (the Llama-3.1 shape).
const DATED: &str = r#"{{- 'Today Date: ' + strftime_now('%d %b %Y') + '\n' }}
{%- for message in messages %}
{{- message.role + ': ' + message.content + '\n' }}
{%- endfor %}
"#;

/// Jinja2 features the published templates lean on: namespace, selectattr, filtered loops,
/// `is string`, `in`, split and slicing, dictsort, default, format, map/unique/join.
const FEATURES: &str = r#"{%- set ns = namespace(last_user=-1, names=[]) %}
{%- for m in messages %}
    {%- if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
{%- endfor %}
{%- set systems = messages | selectattr('role', 'equalto', 'system') | list %}
{%- if systems | length > 0 and systems[0].content is string %}
    {{- '[sys ' ~ systems[0].content | length ~ '] ' }}
{%- endif %}
{%- for m in messages if m.role != 'system' %}
    {%- set text = m.content if m.content is string else m.content | map(attribute='text') | join(' ') %}
    {%- if m.role == 'assistant' and '</think>' in text %}
        {%- set text = text.split('</think>')[-1].lstrip('\n') %}
    {%- endif %}
    {{- loop.index ~ '/' ~ loop.length ~ ' ' ~ m.role | capitalize ~ ': ' ~ text }}
    {%- if not loop.last %}{{ ' | ' }}{% endif %}
{%- endfor %}
{{- '\nlast user at ' ~ ns.last_user }}
{%- for k, v in opts | dictsort %}{{ '\n' ~ k ~ '=' ~ v | default('unset', true) }}{% endfor %}
{{- '\n' ~ (range(3) | list | reverse | join(',')) ~ ' ' ~ 'abc'[::-1] ~ ' ' ~ ('%s-%d' | format('x', 4)) }}
{{- '\n' ~ (messages | map(attribute='role') | unique | list | join(',')) ~ ' ' ~ (messages | first).role ~ ' ' ~ (messages | last).role }}
"#;

mod chat_template {
    use std::path::Path;

    use fl_engine::chat_template::{ChatTemplate, ChatTemplateError};
    use serde_json::{json, Value};

    use super::{CHATML, DATED, FEATURES, HEADERS, INST, PYMETHODS, TOOLS};

    fn user(content: &str) -> Value {
        json!({"role": "user", "content": content})
    }

    fn assistant(content: &str) -> Value {
        json!({"role": "assistant", "content": content})
    }

    fn system(content: &str) -> Value {
        json!({"role": "system", "content": content})
    }

    fn template(source: &str, bos: Option<&str>, eos: Option<&str>) -> ChatTemplate {
        ChatTemplate::new(source, bos.map(String::from), eos.map(String::from))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn render(t: &ChatTemplate, messages: &[Value], add_generation_prompt: bool) -> String {
        t.render(messages, add_generation_prompt, None)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn render_with(t: &ChatTemplate, messages: &[Value], extra: Value) -> String {
        let Value::Object(extra) = extra else {
            panic!("extra must be an object")
        };
        t.render(messages, false, Some(&extra))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn chatml_default_system_and_generation_prompt() {
        let t = template(CHATML, None, None);
        assert_eq!(
            render(&t, &[user("Hi there")], true),
            "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n\
             <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
        );
        let messages = [
            system("Be brief."),
            user("Hi"),
            assistant("Hello!"),
            user("Bye"),
        ];
        assert_eq!(
            render(&t, &messages, false),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        );
    }

    #[test]
    fn headers_start_with_bos_and_trim_content() {
        let t = template(HEADERS, Some("<|begin_of_text|>"), Some("<|eot_id|>"));
        let text = render(&t, &[system(" Be brief. "), user("Hi\n")], true);
        assert_eq!(
            text,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert!(t.starts_with_bos(&text));
    }

    #[test]
    fn inst_whitespace_from_trim_and_lstrip_blocks() {
        let t = template(INST, Some("<s>"), Some("</s>"));
        let messages = [
            system("Be brief. "),
            user(" Hi "),
            assistant(" Hello! "),
            user("Bye"),
        ];
        // The newline after `{{ bos_token }}` stays: trim_blocks only eats the one after a
        // block tag, as in Jinja2.
        assert_eq!(
            render(&t, &messages, false),
            "<s>\n[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]\n Hello!</s>\n[INST] Bye [/INST]\n"
        );
        assert_eq!(render(&t, &[user("Hi")], true), "<s>\n[INST] Hi [/INST]\n");
    }

    #[test]
    fn raise_exception_carries_its_message() {
        let t = template(INST, Some("<s>"), Some("</s>"));
        let err = t
            .render(&[user("Hi"), user("again")], false, None)
            .unwrap_err();
        match &err {
            ChatTemplateError::Raised { message } => assert_eq!(
                message,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            ),
            other => panic!("expected Raised, got {other:?}"),
        }
        assert!(err.to_string().contains("roles must alternate"), "{err}");
    }

    #[test]
    fn python_methods_and_python_printing() {
        let t = template(PYMETHODS, None, None);
        let messages = [
            user("  /search rust  jinja  "),
            user("Is it ¿working?\nreally?"),
            assistant(" fine "),
        ];
        let meta = json!({"meta": {"a": 1, "b": true, "c": null, "d": 0.5, "e": [1, "x", false], "f": 1e-05}});
        assert_eq!(
            render_with(&t, &messages, meta),
            "<cmd>search</cmd>Rust  Jinja\nUSER asks: Is it ¿working? really?\nassistant: fine\n\
             a=1;b=True;c=None;d=0.5;e=[1, 'x', False];f=1e-05;\nfallback"
        );
    }

    #[test]
    fn jinja2_features_used_by_published_templates() {
        let t = template(FEATURES, None, None);
        let messages = [
            system("Be kind."),
            user("Hi"),
            assistant("<think>\nhmm\n</think>\n\nHello"),
            json!({"role": "user", "content": [
                {"type": "text", "text": "look"},
                {"type": "text", "text": "here"}
            ]}),
        ];
        assert_eq!(
            render_with(&t, &messages, json!({"opts": {"a": "", "b": 2, "c": "z"}})),
            "[sys 8] 1/3 User: Hi | 2/3 Assistant: Hello | 3/3 User: look here\n\
             last user at 3\na=unset\nb=2\nc=z\n2,1,0 cba x-4\nsystem,user,assistant system user"
        );
    }

    #[test]
    fn tojson_as_python_json_dumps() {
        let t = template(TOOLS, None, None);
        let tools = json!({"tools": [{"function": {
            "description": "Weather <now> & later, in °C",
            "name": "get_weather",
            "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}
        }, "type": "function"}]});
        let messages = [
            user("Weather in Zürich?"),
            json!({"content": null, "role": "assistant", "tool_calls": [{
                "function": {"arguments": {"city": "Zürich", "days": 2, "metric": true, "ratio": 0.25}, "name": "get_weather"},
                "id": "c1", "type": "function"
            }]}),
        ];
        assert_eq!(
            render_with(&t, &messages, tools),
            "<tools>\n{\"function\": {\"description\": \"Weather <now> & later, in °C\", \
             \"name\": \"get_weather\", \"parameters\": {\"properties\": {\"city\": {\"type\": \
             \"string\"}}, \"required\": [\"city\"], \"type\": \"object\"}}, \"type\": \
             \"function\"}\n</tools>\nuser: Weather in Zürich?\n<call>{\"arguments\": {\"city\": \
             \"Zürich\", \"days\": 2, \"metric\": true, \"ratio\": 0.25}, \"name\": \
             \"get_weather\"}</call>\n{\n  \"content\": null,\n  \"role\": \"assistant\",\n  \
             \"tool_calls\": [\n    {\n      \"function\": {\n        \"arguments\": {\n          \
             \"city\": \"Zürich\",\n          \"days\": 2,\n          \"metric\": true,\n          \
             \"ratio\": 0.25\n        },\n        \"name\": \"get_weather\"\n      },\n      \
             \"id\": \"c1\",\n      \"type\": \"function\"\n    }\n  ]\n}"
        );
        // tools default to none (falsy), as transformers passes them; keys keep the client's
        // order (serde_json and minijinja with preserve_order), as Python dicts do.
        assert_eq!(
            render(&t, &[user("x")], false),
            "user: x\n{\n  \"role\": \"user\",\n  \"content\": \"x\"\n}"
        );
    }

    #[test]
    fn tojson_options() {
        let t = template(
            "{{ x | tojson }}|{{ x | tojson(ensure_ascii=true) }}|\
             {{ x | tojson(sort_keys=true, separators=(',', ':')) }}|{{ x | tojson(true, 1) }}|\
             {{ e | tojson }}|{{ e | tojson(indent=2) }}",
            None,
            None,
        );
        let extra = json!({
            "x": {"a": [1, 2.0, null, false, -0.5e-7], "z": "é\u{2028}😀\t\"\\<>&'\u{1}"},
            "e": {"d": {}, "l": []}
        });
        assert_eq!(
            render_with(&t, &[], extra),
            "{\"a\": [1, 2.0, null, false, -5e-08], \"z\": \"é\u{2028}😀\\t\\\"\\\\<>&'\\u0001\"}|\
             {\"a\": [1, 2.0, null, false, -5e-08], \"z\": \"\\u00e9\\u2028\\ud83d\\ude00\\t\\\"\\\\<>&'\\u0001\"}|\
             {\"a\":[1,2.0,null,false,-5e-08],\"z\":\"é\u{2028}😀\\t\\\"\\\\<>&'\\u0001\"}|\
             {\n \"a\": [\n  1,\n  2.0,\n  null,\n  false,\n  -5e-08\n ],\n \
             \"z\": \"\\u00e9\\u2028\\ud83d\\ude00\\t\\\"\\\\<>&'\\u0001\"\n}|\
             {\"d\": {}, \"l\": []}|{\n  \"d\": {},\n  \"l\": []\n}"
        );
        let bad = template("{{ 1 | tojson(indent=2, bogus=1) }}", None, None);
        assert!(matches!(
            bad.render(&[], false, None),
            Err(ChatTemplateError::Render { .. })
        ));
    }

    #[test]
    fn strftime_now_formats_local_time() {
        let t = template(DATED, None, None);
        let before = chrono::Local::now().format("%d %b %Y").to_string();
        let text = render(&t, &[user("Hi")], false);
        let after = chrono::Local::now().format("%d %b %Y").to_string();
        assert!(
            text == format!("Today Date: {before}\nuser: Hi\n")
                || text == format!("Today Date: {after}\nuser: Hi\n"),
            "{text:?}"
        );
        let bad = template("{{ strftime_now('%Q') }}", None, None);
        assert!(matches!(
            bad.render(&[], false, None),
            Err(ChatTemplateError::Render { .. })
        ));
    }

    #[test]
    fn whitespace_control_as_jinja2() {
        let t = template(
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n    <u>{{ m.content }}</u>\n    {% endif %}\n{% endfor %}\nend\n",
            None,
            None,
        );
        let messages = [user("a"), json!({"role": "bot", "content": "b"})];
        assert_eq!(render(&t, &messages, false), "    <u>a</u>\nend");
        // One trailing newline of the template is dropped (keep_trailing_newline off).
        assert_eq!(render(&template("x\n", None, None), &[], false), "x");
        assert_eq!(render(&template("x\n\n", None, None), &[], false), "x\n");
    }

    #[test]
    fn undefined_is_lenient_like_jinja2() {
        let t = template(
            "[{{ missing }}]{% for x in missing %}X{% endfor %}\
             {% if missing %}T{% else %}F{% endif %}[{{ messages[0].nope }}]",
            None,
            None,
        );
        assert_eq!(render(&t, &[json!({"role": "user"})], false), "[]F[]");
        let t = template("{{ missing.attr }}", None, None);
        assert!(matches!(
            t.render(&[], false, None),
            Err(ChatTemplateError::Render { .. })
        ));
    }

    #[test]
    fn none_and_booleans_print_as_python() {
        let t = template(
            "{{ messages[0].content }}|{{ [none, true] }}|{{ 3.0 }}|{{ 2 }}|{{ ['it\\'s'] }}",
            None,
            None,
        );
        let messages = [json!({"role": "assistant", "content": null})];
        assert_eq!(
            render(&t, &messages, false),
            "None|[None, True]|3.0|2|[\"it's\"]"
        );
    }

    #[test]
    fn loop_controls_and_generation_blocks() {
        let t = template(
            "{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}\
             {% if m.role == 'stop' %}{% break %}{% endif %}{{ m.role }},{% endfor %}",
            None,
            None,
        );
        let roles: Vec<Value> = ["a", "skip", "b", "stop", "c"]
            .iter()
            .map(|r| json!({"role": r}))
            .collect();
        assert_eq!(render(&t, &roles, false), "a,b,");

        let t = template(
            "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}\
             {% endgeneration %}{% else %}{{ m.content }}{% endif %}|{% endfor %}",
            None,
            None,
        );
        assert_eq!(render(&t, &[user("q"), assistant("a")], false), "q|a|");
    }

    #[test]
    fn syntax_error_names_the_line() {
        let err = ChatTemplate::new(
            "{% for m in messages %}\n{{ m.content }}\n{% endif %}",
            None,
            None,
        )
        .unwrap_err();
        match &err {
            ChatTemplateError::Syntax { line, .. } => assert_eq!(*line, Some(3)),
            other => panic!("expected Syntax, got {other:?}"),
        }
        assert!(err.to_string().contains("line 3"), "{err}");
    }

    #[test]
    fn bad_messages_and_arguments_are_named() {
        let t = template(CHATML, None, None);
        let err = t.render(&[user("a"), json!("b")], false, None).unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::Message { index: 1, .. }),
            "{err:?}"
        );
        let err = t
            .render(&[json!({"content": "a"})], false, None)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("messages[0]: missing field `role`"),
            "{err}"
        );
        let err = t
            .render(&[json!({"role": 3, "content": "a"})], false, None)
            .unwrap_err();
        assert!(err.to_string().contains("role"), "{err}");
        let Value::Object(extra) = json!({"messages": []}) else {
            unreachable!()
        };
        let err = t.render(&[user("a")], false, Some(&extra)).unwrap_err();
        assert!(
            matches!(&err, ChatTemplateError::Argument { key, .. } if key == "messages"),
            "{err:?}"
        );
    }

    #[test]
    fn bos_rule_for_tokenizing() {
        let headers = template(HEADERS, Some("<|begin_of_text|>"), None);
        let text = render(&headers, &[user("Hi")], true);
        assert!(headers.starts_with_bos(&text));
        // The template put BOS: never add it again, whatever the tokenizer config says.
        assert!(!headers.add_special_tokens(&text));
        let headers = headers.with_add_bos_token(Some(true));
        assert!(!headers.add_special_tokens(&text));

        let chatml = template(CHATML, Some("<s>"), None);
        let text = render(&chatml, &[user("Hi")], true);
        assert!(!chatml.starts_with_bos(&text));
        // No BOS in the text: only a tokenizer that asks for one gets it.
        assert!(!chatml.add_special_tokens(&text));
        let chatml = chatml.with_add_bos_token(Some(true));
        assert!(chatml.add_special_tokens(&text));
        let no_bos = template(CHATML, None, None).with_add_bos_token(Some(true));
        assert!(!no_bos.starts_with_bos(&text));
        assert!(!no_bos.add_special_tokens(&text));
    }

    #[test]
    fn model_dir_string_template_and_added_token_bos() {
        let dir = tempfile::tempdir().unwrap();
        let config = json!({
            "add_bos_token": true,
            "bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": false, "normalized": false, "rstrip": false, "single_word": false},
            "eos_token": "</s>",
            "unk_token": {"content": "<unk>"},
            "pad_token": null,
            "chat_template": INST,
        });
        write(dir.path(), "tokenizer_config.json", &config.to_string());
        let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(t.bos_token(), Some("<s>"));
        assert_eq!(t.eos_token(), Some("</s>"));
        assert_eq!(t.add_bos_token(), Some(true));
        let text = render(&t, &[user("Hi"), assistant("Yo")], false);
        assert_eq!(text, "<s>\n[INST] Hi [/INST]\n Yo</s>\n");
        assert!(t.starts_with_bos(&text));
        assert!(!t.add_special_tokens(&text));

        let t = ChatTemplate::new("{{ unk_token }}", None, None).unwrap();
        assert_eq!(render(&t, &[], false), "");
        write(
            dir.path(),
            "tokenizer_config.json",
            &json!({"unk_token": {"content": "<unk>"}, "chat_template": "{{ unk_token }}|{{ pad_token }}"}).to_string(),
        );
        let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(render(&t, &[], false), "<unk>|");
    }

    #[test]
    fn model_dir_named_templates() {
        let dir = tempfile::tempdir().unwrap();
        let config = json!({
            "bos_token": "<s>",
            "chat_template": [
                {"name": "rag", "template": "{% broken"},
                {"name": "tool_use", "template": "tools:{{ tools | length }}"},
                {"name": "default", "template": "default:{{ messages | length }}"},
            ],
        });
        write(dir.path(), "tokenizer_config.json", &config.to_string());
        let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert!(t.has_tool_use_template());
        assert_eq!(render(&t, &[user("a")], false), "default:1");
        // Tools pick `tool_use`, as transformers does; none-valued tools do not.
        assert_eq!(
            render_with(&t, &[user("a")], json!({"tools": [{"type": "function"}]})),
            "tools:1"
        );
        assert_eq!(
            render_with(&t, &[user("a")], json!({"tools": null})),
            "default:1"
        );

        let config = json!({"chat_template": [{"name": "rag", "template": "x"}]});
        write(dir.path(), "tokenizer_config.json", &config.to_string());
        let err = ChatTemplate::from_model_dir(dir.path()).unwrap_err();
        assert!(
            matches!(&err, ChatTemplateError::Config { .. }) && err.to_string().contains("default"),
            "{err}"
        );
    }

    #[test]
    fn model_dir_separate_template_files() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "tokenizer_config.json",
            &json!({"eos_token": "<|im_end|>", "chat_template": "from config"}).to_string(),
        );
        // chat_template.json (the processor format) overrides the config's field...
        write(
            dir.path(),
            "chat_template.json",
            &json!({"chat_template": "from json{{ eos_token }}"}).to_string(),
        );
        let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(render(&t, &[], false), "from json<|im_end|>");
        // ...and chat_template.jinja, as newer transformers writes it, overrides both.
        write(dir.path(), "chat_template.jinja", CHATML);
        std::fs::create_dir(dir.path().join("additional_chat_templates")).unwrap();
        write(
            &dir.path().join("additional_chat_templates"),
            "tool_use.jinja",
            "with tools",
        );
        let t = ChatTemplate::from_model_dir(dir.path()).unwrap().unwrap();
        assert_eq!(t.eos_token(), Some("<|im_end|>"));
        assert_eq!(
            render(&t, &[user("Hi there")], true),
            "<|im_start|>system\nYou are a concise assistant.<|im_end|>\n\
             <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render_with(&t, &[user("a")], json!({"tools": []})),
            "with tools"
        );

        // A template file alone is enough.
        let bare = tempfile::tempdir().unwrap();
        write(
            bare.path(),
            "chat_template.jinja",
            "{{ messages[0].content }}\n",
        );
        let t = ChatTemplate::from_model_dir(bare.path()).unwrap().unwrap();
        assert_eq!(t.bos_token(), None);
        assert_eq!(render(&t, &[user("only")], false), "only");
    }

    #[test]
    fn model_dir_without_template_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(ChatTemplate::from_model_dir(dir.path()).unwrap().is_none());
        write(
            dir.path(),
            "tokenizer_config.json",
            &json!({"bos_token": "<s>", "eos_token": "</s>"}).to_string(),
        );
        assert!(ChatTemplate::from_model_dir(dir.path()).unwrap().is_none());
        write(
            dir.path(),
            "tokenizer_config.json",
            &json!({"chat_template": null}).to_string(),
        );
        assert!(ChatTemplate::from_model_dir(dir.path()).unwrap().is_none());
    }

    #[test]
    fn model_dir_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "tokenizer_config.json", "{ not json");
        let err = ChatTemplate::from_model_dir(dir.path()).unwrap_err();
        assert!(
            matches!(&err, ChatTemplateError::Config { path, .. } if path.ends_with("tokenizer_config.json")),
            "{err:?}"
        );
        write(
            dir.path(),
            "tokenizer_config.json",
            &json!({"chat_template": "{% if %}"}).to_string(),
        );
        let err = ChatTemplate::from_model_dir(dir.path()).unwrap_err();
        assert!(
            matches!(&err, ChatTemplateError::Syntax { origin, line: Some(1), .. } if origin.contains("tokenizer_config.json")),
            "{err:?}"
        );
        write(
            dir.path(),
            "tokenizer_config.json",
            &json!({"bos_token": 1, "chat_template": "x"}).to_string(),
        );
        let err = ChatTemplate::from_model_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("bos_token"), "{err}");
    }

    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<ChatTemplate>();
    }
}
