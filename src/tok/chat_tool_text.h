/* Fixed text of the tool sections of the Qwen3.5 and Qwen2.5 chat templates
 * (tools/python/templates/qwen3_5.jinja, qwen2.jinja), as data. */
static const char QWEN35_TOOLS_HEAD[] =
    "# Tools\n"
    "\n"
    "You have access to the following functions:\n"
    "\n"
    "<tools>";
static const char QWEN35_TOOLS_TAIL[] =
    "\n"
    "\n"
    "If you choose to call a function ONLY reply in the following format with NO suffix:\n"
    "\n"
    "<tool_call>\n"
    "<function=example_function_name>\n"
    "<parameter=example_parameter_1>\n"
    "value_1\n"
    "</parameter>\n"
    "<parameter=example_parameter_2>\n"
    "This is the value for the second parameter\n"
    "that can span\n"
    "multiple lines\n"
    "</parameter>\n"
    "</function>\n"
    "</tool_call>\n"
    "\n"
    "<IMPORTANT>\n"
    "Reminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n"
    "- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n"
    "</IMPORTANT>";
static const char QWEN2_TOOLS_HEAD[] =
    "\n"
    "\n"
    "# Tools\n"
    "\n"
    "You may call one or more functions to assist with the user query.\n"
    "\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n"
    "<tools>";
static const char QWEN2_TOOLS_TAIL[] =
    "\n"
    "</tools>\n"
    "\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n"
    "<tool_call>\n"
    "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
    "</tool_call><|im_end|>\n";
