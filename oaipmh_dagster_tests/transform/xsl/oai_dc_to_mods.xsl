<?xml version="1.0" encoding="UTF-8"?>
<!-- Simple Dublin Core (oai_dc) to a small MODS-like record.
     Parameter: source, the record content source (recordInfo/recordContentSource). -->
<xsl:stylesheet version="1.0"
    xmlns:xsl="http://www.w3.org/1999/XSL/Transform"
    xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
    xmlns:dc="http://purl.org/dc/elements/1.1/"
    xmlns:mods="http://www.loc.gov/mods/v3"
    exclude-result-prefixes="oai_dc dc">
  <xsl:output method="xml" indent="no"/>
  <xsl:param name="source" select="'unknown'"/>

  <xsl:template match="/oai_dc:dc">
    <mods:mods>
      <xsl:for-each select="dc:title[normalize-space()]">
        <mods:titleInfo><mods:title><xsl:value-of select="normalize-space()"/></mods:title></mods:titleInfo>
      </xsl:for-each>
      <xsl:for-each select="dc:creator[normalize-space()]">
        <mods:name type="personal">
          <mods:namePart><xsl:value-of select="normalize-space()"/></mods:namePart>
          <mods:role><mods:roleTerm type="text">creator</mods:roleTerm></mods:role>
        </mods:name>
      </xsl:for-each>
      <xsl:if test="dc:date[normalize-space()] or dc:publisher[normalize-space()]">
        <mods:originInfo>
          <xsl:for-each select="dc:publisher[normalize-space()]">
            <mods:publisher><xsl:value-of select="normalize-space()"/></mods:publisher>
          </xsl:for-each>
          <xsl:for-each select="dc:date[normalize-space()]">
            <mods:dateIssued><xsl:value-of select="normalize-space()"/></mods:dateIssued>
          </xsl:for-each>
        </mods:originInfo>
      </xsl:if>
      <xsl:for-each select="dc:subject[normalize-space()]">
        <mods:subject><mods:topic><xsl:value-of select="normalize-space()"/></mods:topic></mods:subject>
      </xsl:for-each>
      <xsl:for-each select="dc:description[normalize-space()]">
        <mods:abstract><xsl:value-of select="normalize-space()"/></mods:abstract>
      </xsl:for-each>
      <xsl:for-each select="dc:identifier[normalize-space()]">
        <mods:identifier>
          <xsl:attribute name="type">
            <xsl:choose>
              <xsl:when test="starts-with(normalize-space(), 'http')">uri</xsl:when>
              <xsl:otherwise>local</xsl:otherwise>
            </xsl:choose>
          </xsl:attribute>
          <xsl:value-of select="normalize-space()"/>
        </mods:identifier>
      </xsl:for-each>
      <xsl:for-each select="dc:language[normalize-space()]">
        <mods:language><mods:languageTerm><xsl:value-of select="normalize-space()"/></mods:languageTerm></mods:language>
      </xsl:for-each>
      <mods:recordInfo>
        <mods:recordContentSource><xsl:value-of select="$source"/></mods:recordContentSource>
      </mods:recordInfo>
    </mods:mods>
  </xsl:template>

  <!-- Anything that is not oai_dc stops the transform: the record keeps its raw XML. -->
  <xsl:template match="/*[not(self::oai_dc:dc)]">
    <xsl:message terminate="yes">not an oai_dc record: <xsl:value-of select="name()"/></xsl:message>
  </xsl:template>
</xsl:stylesheet>
